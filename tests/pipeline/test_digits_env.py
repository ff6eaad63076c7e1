"""The built-in digits env runs the whole pipeline: a fresh checkout with the micro preset, `env.name: digits`,
one `dvc repro`, then its real outputs: shards, rollout records, metrics with intervals, the report's rows.

It runs with the R1 think/answer option on (`env.digits.think: true`), so the same run also carries that option
through every stage: SFT on tagged targets, prompts with the instruction, the structure's reward component."""

from __future__ import annotations

import json

import pytest
from pipeline_helpers import STAGES, env_pipeline, read_records, stages_run

POLICIES = ("base", "sft", "grpo")
TASK_METRICS = ("accuracy", "accuracy_sort", "accuracy_sum")


@pytest.fixture(scope="module")
def digits_pipeline(tmp_path_factory):
    # the tagged SFT target is ~20 tokens: room for it in training and rollouts
    overlay = {"env": {"name": "digits", "digits": {"think": True}}, "eval": {"hf_samples": 2},
               "train": {"max_new_tokens": 32}, "rollout": {"max_new_tokens": 32}}
    return env_pipeline(tmp_path_factory.mktemp("digits"), overlay)


def test_every_stage_ran_on_digits(digits_pipeline):
    root, _, output = digits_pipeline
    assert stages_run(output) == STAGES
    manifest = json.loads((root / "data" / "shards" / "manifest.json").read_text())
    assert manifest["dataset"] == "digits"
    # micro: 16 test samples, 8 out-of-distribution (inverted colours), 64 train less the 8 held out for val
    assert manifest["splits"]["test"]["kept"] == 16 and manifest["splits"]["test_ood"]["kept"] == 8
    assert sorted(p.name for p in (root / "data" / "shards" / "test").glob("*.tar"))


def test_rollouts_hold_digitsread_records(digits_pipeline):
    root, _, _ = digits_pipeline
    for policy in POLICIES:
        records = read_records(root / "outputs" / "rollouts" / f"{policy}.jsonl")
        assert len(records) == 16
        for record in records:
            assert record["env"] == "digits" and record["policy"] == policy
            assert record["truth"]["task"] in ("sort", "sum") and 1 <= len(record["truth"]["digits"]) <= 3
            assert set(record["reward_components"]) == {"format", "correct", "think_format"}
            assert 0 <= record["reward"] <= 1 and record["reward_components"]["think_format"] in (0.0, 0.1)
            assert "numbers" in record["parsed"]
        assert len(read_records(root / "outputs" / "rollouts" / "test_ood" / f"{policy}.jsonl")) == 8


def test_metrics_and_report_name_the_digits_metrics(digits_pipeline):
    root, _, _ = digits_pipeline
    metrics = json.loads((root / "metrics" / "eval.json").read_text())
    counts = {len(r["truth"]["digits"]) for r in read_records(root / "outputs" / "rollouts" / "sft.jsonl")}
    names = [*TASK_METRICS, *(f"accuracy_{n}digit" for n in sorted(counts))]
    for policy in POLICIES:
        assert metrics[policy]["n"] == 16 and metrics[f"{policy}_test_ood"]["n"] == 8
        for name in names:
            low, point, high = (metrics[policy][f"{name}{end}"] for end in ("_ci_low", "", "_ci_high"))
            assert 0 <= low <= point <= high <= 1, (policy, name)
        assert "geoscore" not in metrics[policy]
    assert all(name in metrics["grpo_minus_sft"] for name in TASK_METRICS)
    table = (root / "reports" / "eval.md").read_text()
    for label in ("| accuracy |", "| accuracy, sort |", "| accuracy, sum |", "grpo_minus_sft", "inverted colours"):
        assert label in table, label
    assert "Environment <b>digits</b>" in (root / "reports" / "eval.html").read_text()
