"""params.yaml as vlmgym writes it survives `dvc exp run -S key=value`: DVC's rewrite of the file changes one line.

Each test runs DVC's own code path for `-S` on a params file (dvc.utils.hydra.apply_overrides: ruamel.yaml's
round-trip load, Hydra's override, a merge of plain values into the loaded document and DVC's dumper), not a copy of
it, so a change in how DVC rewrites the file shows here.
"""

import shutil
from pathlib import Path

import pytest
import yaml
from dvc.utils.hydra import apply_overrides

from vlmgym import params

REPO = Path(__file__).resolve().parents[2]
HEADER = "# a params file's leading comment, kept by the writer\n"
LONG_TEXT = "an experiment name long enough, with spaces, for DVC's dumper to fold it over two lines at eighty columns"


def set_by_dvc(path: Path, override: str) -> list[tuple[str, str]]:
    """`dvc exp run -S override` applied to `path` as DVC applies it; the (before, after) lines that differ."""
    before = path.read_text().splitlines()
    apply_overrides(path, [override])
    after = path.read_text().splitlines()
    assert len(after) == len(before), f"{override}: DVC's rewrite has {len(after)} lines, the file {len(before)}"
    return [(a, b) for a, b in zip(before, after) if a != b]


def written(tmp_path: Path, raw: dict) -> tuple[Path, dict]:
    """`raw` written as vlmgym writes a params file (`vlmgym preset`, `vlmgym recipe`); the file and its sections."""
    path = tmp_path / "params.yaml"
    path.write_text(HEADER)
    return path, params.write_params(raw, path, "the test's values")


def repo_params() -> dict:
    return params.read_yaml(REPO / "params.yaml")


def test_repo_params_file_is_the_writers_output(tmp_path):
    # so the checked-in file has the form DVC keeps; regenerate it with write_params when this fails
    path = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", path)
    params.write_params(params.read_yaml(path), path, "params.yaml")
    assert path.read_text() == (REPO / "params.yaml").read_text()


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("train.optimizer.lr=3e-5", "    lr: 3e-05   # peak learning rate"),
        ("train.steps=200", "  steps: 200  # training steps (one batch of prompts each)"),
        ("env.geospot.tau_end_factor=0.5", "    tau_end_factor: 0.5  "),  # the key after a block list
        ("eval.reward_curve_metric=reward_mean", "  reward_curve_metric: reward_mean  "),  # the file's last key
    ],
)
def test_dvc_set_param_changes_one_line_of_repo_params(tmp_path, override, line):
    path = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", path)
    changed = set_by_dvc(path, override)
    assert len(changed) == 1, changed
    assert changed[0][1].startswith(line)


def test_dvc_set_param_changes_one_line_of_any_written_file(tmp_path):
    # the forms the default file lacks: block lists ending sections, a string folded over lines, a flow mapping
    raw = repo_params()
    raw["sft"]["mesh"] = [1, 2, 1]
    raw["train"]["mesh"] = [2, 1, 1]
    raw["eval"]["comparisons"] = [["grpo", "sft"], ["sft", "base"]]
    raw["tracking"]["experiment"] = LONG_TEXT
    raw["env"] = {"name": "mixture", "recipe": "", "mixture": {"envs": {"digits": 1.0, "rec": 2.0}}}
    path, sections = written(tmp_path, raw)
    text = path.read_text()
    assert text.startswith(HEADER + "\n")
    assert "envs: {digits: 1.0, rec: 2.0}" in text and "  mesh:  # " in text
    assert params.load_all(path) == sections
    for override in ["train.optimizer.lr=3e-5", "sft.seed=3", "tracking.system_metrics=false", "eval.seed=1"]:
        assert len(set_by_dvc(path, override)) == 1, override
    assert params.load_all(path)["tracking"].experiment == LONG_TEXT


def test_values_yaml_1_1_reads_otherwise_are_written_as_vlmgym_reads_them(tmp_path):
    # DVC's dumper writes YAML 1.2, where `on`, `1:30` are strings and `1e-05` a number; vlmgym reads with PyYAML
    # (YAML 1.1): true, 90 and a string
    raw = repo_params()
    raw["tracking"]["experiment"] = "on"
    raw["data"]["hub_repo"] = "1:30"
    raw["train"]["optimizer"]["lr"] = 1e-5
    path, _ = written(tmp_path, raw)
    read = yaml.safe_load(path.read_text())
    assert (read["tracking"]["experiment"], read["data"]["hub_repo"], read["train"]["optimizer"]["lr"]) == \
        ("on", "1:30", 1e-5)
    assert "    lr: 1.0e-05  # " in path.read_text()


def test_a_float_written_for_yaml_1_1_survives_dvc_set_param(tmp_path):
    # DVC keeps a number's text as the file has it (unlike a string's quotes), so `1.0e-05` changes no other line
    raw = repo_params()
    raw["train"]["optimizer"]["lr"] = 1e-5
    raw["sft"]["optimizer"]["lr"] = 2.5e-6
    path, _ = written(tmp_path, raw)
    assert set_by_dvc(path, "train.steps=200") == [("  steps: 150  # training steps (one batch of prompts each)",
                                                     "  steps: 200  # training steps (one batch of prompts each)")]
    assert params.load_all(path)["sft"].optimizer.lr == 2.5e-6


@pytest.mark.parametrize(("override", "key", "value"), [
    ("+train.num_generations=4", ("group_size",), 4),
    ("+train.optimizer.learning_rate=3e-5", ("optimizer", "lr"), 3e-5),
    ("+train.beta=0.04", ("objective", "beta"), 0.04),
])
def test_a_trl_name_added_by_dvc_set_param_replaces_the_key_params_yaml_holds(tmp_path, capsys, override, key, value):
    path = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", path)
    before = path.read_text().splitlines()
    apply_overrides(path, [override])
    after = path.read_text().splitlines()
    assert len(after) == len(before) + 1 and set(before) <= set(after)  # one line added, the rest kept
    train = params.load_section("train", path)
    for part in key:
        train = getattr(train, part)
    assert train == value
    assert " replaces train." in capsys.readouterr().err
