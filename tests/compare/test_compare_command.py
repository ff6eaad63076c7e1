"""`vlmgym compare` writes a study (studies/<name>/) from its flags and runs it with `dvc repro`: no cache of its own
(DVC's is the cache); the study itself runs in tests/compare/test_study_pipeline.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vlmgym.compare.command import main, parse_variants
from vlmgym.params import ParamsError


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository root whose `dvc repro` is recorded (and writes the report) instead of run."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": {"validation": {"select": "best_val"}}}))
    monkeypatch.chdir(tmp_path)
    calls = []

    def run(args, env):
        calls.append(args)
        (tmp_path / "studies/compare/report.md").write_text("# the report\n")
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(subprocess, "run", run)
    return calls


def test_compare_writes_the_study_runs_it_with_dvc_and_prints_its_report(repo, capsys):
    assert main(["--arms", "grpo", "sft_longer", "--seeds", "3", "--first-seed", "5",
                 "--variant", "gspo=importance_sampling_level=sequence,optimizer.lr=3e-5"]) == 0
    raw = yaml.safe_load(Path("studies/compare/params.yaml").read_text())
    assert raw["study"] == {"base_params": "../../params.yaml", "env": "geospot", "seeds": [5, 6, 7],
                            "arms": ["grpo", "sft_longer", "gspo"], "select": "best_val"}
    assert raw["arm"] == {"grpo": {}, "sft_longer": {},
                          "gspo": {"objective.importance_sampling_level": "sequence", "optimizer.lr": 3e-5}}
    assert repo == [[sys.executable, "-m", "dvc", "repro", "studies/compare/dvc.yaml"]]
    assert capsys.readouterr().out.endswith("# the report\n\n")
    # again with other arms: the same study, rewritten (DVC reruns what changed)
    assert main(["--arms", "grpo", "--select", "last"]) == 0
    raw = yaml.safe_load(Path("studies/compare/params.yaml").read_text())
    assert raw["study"]["seeds"] == [0] and raw["study"]["arms"] == ["grpo"] and raw["study"]["select"] == "last"


def test_a_variant_is_validated_before_anything_runs(repo):
    with pytest.raises(ParamsError, match=r"--variant fast: .*train.optimizer.lr: expected a number"):
        main(["--arms", "grpo", "--variant", "fast=optimizer.lr=abc"])
    with pytest.raises(ParamsError, match="--variant fast.seed: set by the study"):
        main(["--arms", "grpo", "--variant", "fast=seed=3"])
    assert repo == []


@pytest.mark.parametrize(("spec", "message"), [
    ("grpo=lr=1e-3", "the name 'grpo' is taken"),
    ("sft_blind=lr=1e-3", "the name 'sft_blind' is taken"),
    ("two words=lr=1e-3", "with NAME a word"),
    ("lr", "with NAME a word"),
    ("fast=lr", "'lr' is not KEY=VALUE"),
    ("fast=lr=1e-3,", "'' is not KEY=VALUE"),
])
def test_a_malformed_variant_is_an_error_naming_it(spec, message):
    with pytest.raises(ValueError, match=message) as raised:
        parse_variants([spec])
    assert spec in str(raised.value)


def test_two_variants_may_not_share_a_name_and_seeds_are_checked(repo, capsys):
    with pytest.raises(ValueError, match="the name 'a' is taken"):
        parse_variants(["a=optimizer.lr=1e-3", "a=optimizer.lr=3e-4"])
    with pytest.raises(SystemExit):
        main(["--seeds", "0"])
    assert "needs N >= 1 seeds" in capsys.readouterr().err and repo == []
