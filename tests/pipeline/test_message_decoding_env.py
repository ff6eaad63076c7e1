"""The built-in message_decoding env runs the whole pipeline: a fresh checkout with the micro preset,
`env.name: message_decoding`, one `dvc repro`, then its real outputs: shards, rollout records, metrics with
intervals, the report's rows."""

from __future__ import annotations

import json

import pytest
from pipeline_helpers import STAGES, env_pipeline, read_records, stages_run

from vlmgym.envs.message_decoding.env import length_group

POLICIES = ("base", "sft", "grpo")
TASK_METRICS = ("accuracy", "char_accuracy")


@pytest.fixture(scope="module")
def message_decoding_pipeline(tmp_path_factory):
    overlay = {"env": {"name": "message_decoding"}, "eval": {"hf_samples": 2}}
    return env_pipeline(tmp_path_factory.mktemp("message_decoding"), overlay)


def test_every_stage_ran_on_message_decoding(message_decoding_pipeline):
    root, _, output = message_decoding_pipeline
    assert stages_run(output) == STAGES
    manifest = json.loads((root / "data" / "shards" / "manifest.json").read_text())
    assert manifest["dataset"] == "message_decoding"
    # micro: 16 test samples, 8 out-of-distribution (longer words), 64 train less the 8 held out for val
    assert manifest["splits"]["test"]["kept"] == 16 and manifest["splits"]["test_ood"]["kept"] == 8
    assert sorted(p.name for p in (root / "data" / "shards" / "test").glob("*.tar"))


def test_rollouts_hold_message_decodingread_records(message_decoding_pipeline):
    root, _, _ = message_decoding_pipeline
    for policy in POLICIES:
        records = read_records(root / "outputs" / "rollouts" / f"{policy}.jsonl")
        assert len(records) == 16
        for record in records:
            assert record["env"] == "message_decoding" and record["policy"] == policy
            truth = record["truth"]
            assert 3 <= len(truth["answer"]) <= 8 and sorted(truth["decoder"]) == sorted("abcdefghijklmnopqrstuvwxyz")
            assert "".join(truth["decoder"][ord(c) - ord("a")] for c in truth["coded"]) == truth["answer"]
            assert set(record["reward_components"]) == {"format", "correct"} and 0 <= record["reward"] <= 1
            assert "word" in record["parsed"]
        ood = read_records(root / "outputs" / "rollouts" / "test_ood" / f"{policy}.jsonl")
        assert len(ood) == 8 and all(9 <= len(r["truth"]["answer"]) <= 10 for r in ood)


def test_metrics_and_report_name_the_message_decoding_metrics(message_decoding_pipeline):
    root, _, _ = message_decoding_pipeline
    metrics = json.loads((root / "metrics" / "eval.json").read_text())
    lengths = {len(r["truth"]["answer"]) for r in read_records(root / "outputs" / "rollouts" / "sft.jsonl")}
    names = [*TASK_METRICS, *sorted({length_group(n) for n in lengths})]
    for policy in POLICIES:
        assert metrics[policy]["n"] == 16 and metrics[f"{policy}_test_ood"]["n"] == 8
        for name in names:
            low, point, high = (metrics[policy][f"{name}{end}"] for end in ("_ci_low", "", "_ci_high"))
            assert 0 <= low <= point <= high <= 1, (policy, name)
        assert "geoscore" not in metrics[policy] and "accuracy_9to10" not in metrics[policy]
    assert all(name in metrics["grpo_minus_sft"] for name in TASK_METRICS)
    table = (root / "reports" / "eval.md").read_text()
    for label in ("| accuracy |", "| character accuracy |", "grpo_minus_sft",
                  "words of 9-10 letters, longer than train ever uses"):
        assert label in table, label
    assert "Environment <b>message_decoding</b>" in (root / "reports" / "eval.html").read_text()
