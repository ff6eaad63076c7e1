"""`vlmgym compare` reuses a finished arm: nothing again with the same settings and data, only the answers on a split
whose shards changed (its model is kept), everything again with other settings."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from vlmgym.compare import command
from vlmgym.params import load_section

SPLITS = ["test", "test_ood"]


@pytest.fixture
def arm(tmp_path, monkeypatch):
    """run_arm over a two-split shards folder, with training and answering recorded instead of run."""
    shards = tmp_path / "shards"
    for split in SPLITS:
        (shards / split).mkdir(parents=True)
        (shards / split / "shard-000000.tar").write_bytes(split.encode())
    calls = {"trained": 0, "answered": []}
    settings = {"key": "settings-a"}

    def train_arm(name, config, sections, log_metrics):
        calls["trained"] += 1
        (tmp_path / "model").mkdir(exist_ok=True)
        return tmp_path / "model"

    def answer(model_dir, split, name, sections, blank_images=False):
        calls["answered"].append(split)
        data = (shards / split / "shard-000000.tar").read_bytes().decode()
        return [{"id": f"{split}-0", "model": str(model_dir), "data": data}]

    monkeypatch.setattr(command, "train_arm", train_arm)
    monkeypatch.setattr(command, "answer", answer)
    monkeypatch.setattr(command, "fingerprint", lambda *args: settings["key"])
    sections = {"rollout": SimpleNamespace(shards_dir=str(shards)), "train": SimpleNamespace(init_dir="unused")}
    config = SimpleNamespace(out_dir=str(tmp_path / "model"))

    def run():
        calls["answered"].clear()
        return command.run_arm("grpo", config, sections, tmp_path / "grpo", SPLITS, log_metrics=None)

    return SimpleNamespace(run=run, calls=calls, shards=shards, settings=settings, folder=tmp_path / "grpo")


def test_same_settings_and_data_reuse_everything(arm, capsys):
    first = arm.run()
    assert arm.calls["trained"] == 1 and arm.calls["answered"] == SPLITS
    assert arm.run() == first and arm.calls["trained"] == 1 and arm.calls["answered"] == []
    assert "compare: grpo: reusing" in capsys.readouterr().out


def test_a_changed_split_is_answered_again_by_the_same_model(arm, capsys):
    arm.run()
    (arm.shards / "test_ood" / "shard-000000.tar").write_bytes(b"rotated digits")
    test_before = (arm.folder / "test.jsonl").read_bytes()
    answers = arm.run()
    assert arm.calls["trained"] == 1 and arm.calls["answered"] == ["test_ood"]
    assert answers["test_ood"][0]["data"] == "rotated digits" and answers["test"][0]["data"] == "test"
    assert (arm.folder / "test.jsonl").read_bytes() == test_before
    assert "answering test_ood again" in capsys.readouterr().out
    assert arm.run() and arm.calls["answered"] == []  # and then reused like any other


def test_other_settings_train_again(arm):
    arm.run()
    arm.settings["key"] = "settings-b"
    arm.run()
    assert arm.calls["trained"] == 2 and arm.calls["answered"] == SPLITS


def test_answers_without_their_datas_hash_are_made_again_by_the_kept_model(arm):
    arm.run()
    (arm.folder / "done.json").write_text(json.dumps({"fingerprint": "settings-a", "splits": SPLITS}))
    arm.run()
    assert arm.calls["trained"] == 1 and arm.calls["answered"] == SPLITS


def test_a_missing_model_trains_again(arm, tmp_path):
    arm.run()
    (tmp_path / "model").rmdir()
    arm.run()
    assert arm.calls["trained"] == 2


def test_the_training_data_is_part_of_an_arms_settings(tmp_path):
    params = Path(__file__).resolve().parents[2] / "params.yaml"
    sections = {name: load_section(name, params) for name in ("model", "env", "rollout", "train")}
    shards, start = tmp_path / "shards", tmp_path / "start"
    (shards / "train").mkdir(parents=True)
    (shards / "train" / "shard-000000.tar").write_bytes(b"train")
    start.mkdir()
    (start / "config.json").write_text("{}")
    config = replace(sections["train"], shards_dir=str(shards), init_dir=str(start))
    first = command.fingerprint("grpo", config, sections)
    assert command.fingerprint("grpo", config, sections) == first
    (shards / "train" / "shard-000000.tar").write_bytes(b"more train images")
    second = command.fingerprint("grpo", config, sections)
    assert second != first
    (shards / "rl").mkdir()  # prompts held out for RL (shard.rl_samples): what the arm samples
    (shards / "rl" / "shard-000000.tar").write_bytes(b"rl")
    third = command.fingerprint("grpo", config, sections)
    (shards / "rl" / "shard-000000.tar").write_bytes(b"other rl prompts")
    assert len({second, third, command.fingerprint("grpo", config, sections)}) == 3


def test_a_deleted_answer_file_is_answered_again(arm):
    arm.run()
    (arm.folder / "test.jsonl").unlink()
    arm.run()
    assert arm.calls["trained"] == 1 and arm.calls["answered"] == ["test"]
