"""`vlmgym preset` and `vlmgym recipe`: over the defaults unless --on-top, the keys they changed printed, TRL names
replacing vlmgym's, and errors that name the user's files (the merge and the shipped presets: tests/pipeline)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from vlmgym import params as params_mod
from vlmgym.cli import presets, recipes
from vlmgym.recipes import paths

REPO = Path(__file__).resolve().parents[2]
MICRO, QWEN = REPO / "configs/micro.yaml", REPO / "configs/qwen3vl_4b_osv5m.yaml"
HAND_SET_URI = "http://mlflow.example:5000"


@pytest.fixture
def params_file(tmp_path):
    path = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", path)
    return path


@pytest.fixture
def at_defaults(tmp_path):
    """A params file at the defaults but for one key set by hand."""
    path = tmp_path / "params.yaml"
    path.write_text("# my params\n\n")
    params_mod.write_params(presets.defaults(), path, "the defaults")  # the key defaults and the default env's recipe
    path.write_text(path.read_text().replace("tracking_uri: ''", f"tracking_uri: {HAND_SET_URI}"))
    assert params_mod.load_section("tracking", path).tracking_uri == HAND_SET_URI
    return path


def preset(tmp_path, overlay: dict, name: str = "preset.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(overlay))
    return path


def changed_lines(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "changed from the file's previous values" in line)
    return [line.strip() for line in lines[start + 1:]]


def test_a_preset_starts_from_the_defaults(params_file, capsys):
    text = params_file.read_text().replace("tracking_uri: ''", f"tracking_uri: {HAND_SET_URI}")
    params_file.write_text(text)
    assert presets.main([str(MICRO), "--params", str(params_file)]) == 0
    assert presets.main([str(QWEN), "--params", str(params_file)]) == 0
    # every key the reference recipe leaves out is at its default, not micro's, and the hand-set key too
    written = dict(paths(presets.file_values(params_file)))
    expected = dict(paths(params_mod.merged(presets.defaults(), params_mod.read_yaml(QWEN))))
    assert written == expected
    sections = params_mod.load_all(params_file)
    assert sections["rollout"].max_new_tokens == params_mod.RolloutParams().max_new_tokens != 16
    assert sections["eval"].n_resamples == params_mod.EvalParams().n_resamples != 100
    assert sections["tracking"].tracking_uri == ""
    assert params_file.read_text().startswith("# vlmgym pipeline parameters")  # the file's leading comment kept
    out = capsys.readouterr().out
    assert "over the defaults" in out and "set by hand such as tracking.tracking_uri" in out and "--on-top" in out


def test_a_recipe_starts_from_the_defaults(params_file):
    assert presets.main([str(MICRO), "--params", str(params_file)]) == 0
    assert recipes.main(["nlvr2", "--params", str(params_file)]) == 0
    written = dict(paths(presets.file_values(params_file)))
    assert written == dict(paths(params_mod.merged(presets.defaults(), recipes.recipe_overlay("nlvr2"))))
    assert params_mod.load_section("rollout", params_file).max_new_tokens != 16  # micro's is gone


def test_on_top_stacks_a_preset_over_the_files_values(params_file, capsys):
    params_file.write_text(params_file.read_text().replace("tracking_uri: ''", f"tracking_uri: {HAND_SET_URI}"))
    assert presets.main([str(MICRO), "--on-top", "--params", str(params_file)]) == 0
    assert presets.main([str(QWEN), "--on-top", "--params", str(params_file)]) == 0
    sections = params_mod.load_all(params_file)
    assert (sections["rollout"].max_new_tokens, sections["eval"].n_resamples, sections["env"].recipe) == (16, 100, "")
    assert sections["tracking"].tracking_uri == HAND_SET_URI
    assert (sections["train"].steps, sections["model"].source) == (10000, "hf:Qwen/Qwen3-VL-4B-Instruct")
    assert "merged over its values (--on-top)" in capsys.readouterr().out


def test_on_top_stacks_a_recipe_over_the_files_values(params_file):
    assert presets.main([str(MICRO), "--params", str(params_file)]) == 0
    assert recipes.main(["nlvr2", "--on-top", "--params", str(params_file)]) == 0
    sections = params_mod.load_all(params_file)
    assert sections["env"].name == "nlvr2"
    # micro's, kept: no env's recipe sets them
    assert (sections["data"].test_images, sections["model"].tiny_num_layers, sections["eval"].n_resamples) == (
        16, 2, 100)
    # a key some env's recipe sets (ovd's rollout budget) is the new env's value or the default, never the file's
    assert sections["rollout"].max_new_tokens == params_mod.RolloutParams().max_new_tokens


def test_the_changed_keys_are_printed(at_defaults, tmp_path, capsys):
    small = preset(tmp_path, {"eval": {"hf_samples": 2}})
    assert presets.main([str(small), "--on-top", "--params", str(at_defaults)]) == 0
    assert changed_lines(capsys.readouterr().out) == ["eval.hf_samples: 16 -> 2"]
    assert presets.main([str(small), "--params", str(at_defaults)]) == 0
    assert changed_lines(capsys.readouterr().out) == [f"tracking.tracking_uri: {HAND_SET_URI} -> ''"]
    assert presets.main([str(small), "--params", str(at_defaults)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no key changed"
    assert at_defaults.read_text().startswith("# my params\n")


def test_the_keys_a_recipe_changed_are_printed(at_defaults, capsys):
    assert recipes.main(["nlvr2", "--on-top", "--params", str(at_defaults)]) == 0
    expected = {f"{'.'.join(path)}: {before} -> {after}" for path, before, after in [
        (("env", "name"), "geospot", "nlvr2"), (("env", "recipe"), "geospot", "nlvr2"), (("sft", "steps"), 450, 350),
        (("sft", "optimizer", "lr"), 0.003, 0.001), (("train", "optimizer", "lr"), 0.0001, "3.0e-05")]}
    # both recipes sample at temperature 0.6: not a change
    assert set(changed_lines(capsys.readouterr().out)) == expected
    assert params_mod.load_section("tracking", at_defaults).tracking_uri == HAND_SET_URI  # --on-top kept it


def test_an_env_section_only_one_side_holds_is_one_line():
    before = {"data": {"seed": 0, "digits": {"max_digits": 3, "min_scale": 48}}}
    after = {"data": {"seed": 1, "nlvr2": {"pairs": 2}}}
    assert presets.changes(before, after) == ["data.seed: 0 -> 1", "data.nlvr2: added", "data.digits: removed"]


@pytest.mark.parametrize("on_top", [False, True])
def test_an_alias_in_a_preset_replaces_the_canonical_key(params_file, tmp_path, on_top):
    trl = preset(tmp_path, {"train": {"num_generations": 4, "max_completion_length": 32,
                                      "optimizer": {"learning_rate": 2e-5}}})
    assert params_mod.load_section("train", params_file).group_size == 8  # params.yaml holds group_size
    assert presets.main([str(trl), "--params", str(params_file), *(["--on-top"] if on_top else [])]) == 0
    train = params_mod.read_yaml(params_file)["train"]
    assert (train["group_size"], train["max_new_tokens"], train["optimizer"]["lr"]) == (4, 32, 2e-5)
    assert not {"num_generations", "max_completion_length"} & set(train)
    assert "learning_rate" not in train["optimizer"]


def test_a_canonical_key_in_a_preset_replaces_an_alias_the_file_holds(params_file, tmp_path):
    text = params_file.read_text().replace("  group_size: 8", "  num_generations: 4")
    params_file.write_text(text.replace("    lr: 0.0001", "    learning_rate: 0.0001"))
    assert params_mod.load_section("train", params_file).group_size == 4
    assert presets.main([str(preset(tmp_path, {"train": {"group_size": 2}})), "--on-top",
                         "--params", str(params_file)]) == 0
    assert params_mod.load_section("train", params_file).group_size == 2
    assert recipes.main(["nlvr2", "--on-top", "--params", str(params_file)]) == 0  # it sets train.optimizer.lr
    train = params_mod.read_yaml(params_file)["train"]
    assert (train["group_size"], train["optimizer"]["lr"]) == (2, 3e-5) and "num_generations" not in train


def test_an_error_names_the_users_file_never_a_temp_file(params_file, tmp_path, capsys):
    original = params_file.read_text()
    both = preset(tmp_path, {"train": {"num_generations": 4, "group_size": 2}}, "both.yaml")
    bad = preset(tmp_path, {"train": {"group_size": 0}}, "bad.yaml")
    for argv in ([str(both)], [str(both), "--on-top"], [str(bad)], [str(bad), "--on-top"]):
        assert presets.main([*argv, "--params", str(params_file)]) == 1
        out = capsys.readouterr().out
        assert out.startswith(f"error: {argv[0]}") and ".tmp" not in out, out
        if argv[0] == str(both):
            assert f"error: {both}: train.num_generations is another name for group_size" in out
    assert params_file.read_text() == original
    # two other names of one key in the params file: the error names that file
    params_file.write_text(original.replace("  group_size: 8", "  num_generations: 2\n  group_size: 8")
                           .replace("\n  objective:", "\n  loss_type: grpo\n  loss_aggregation: dr_grpo\n  objective:"))
    assert presets.main([str(preset(tmp_path, {"eval": {"hf_samples": 2}})), "--on-top",
                         "--params", str(params_file)]) == 1
    assert capsys.readouterr().out.startswith(f"error: {params_file}: train.loss_type is another name")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_missing_params_file_is_an_error_not_a_new_file(tmp_path, capsys):
    missing = tmp_path / "typo.yaml"
    assert presets.main([str(MICRO), "--params", str(missing)]) == 1
    assert "params file not found" in capsys.readouterr().out and not missing.exists()
