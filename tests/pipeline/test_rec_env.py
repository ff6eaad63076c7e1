"""The built-in rec env runs the whole pipeline: a fresh checkout with the micro preset, `env.name: rec`, one
`dvc repro`, then its real outputs: shards, rollout records, IoU metrics with intervals, the report's rows and its
test images drawn with their boxes."""

from __future__ import annotations

import json
import re

import pytest
from pipeline_helpers import STAGES, env_pipeline, read_records, stages_run

from vlmgym.envs.rec import report as rec_report

POLICIES = ("base", "sft", "grpo")
TASK_METRICS = ("mean_iou", "accuracy_iou50", "accuracy_iou75")


@pytest.fixture(scope="module")
def rec_pipeline(tmp_path_factory):
    return env_pipeline(tmp_path_factory.mktemp("rec"), {"env": {"name": "rec"}, "eval": {"hf_samples": 2}})


def test_every_stage_ran_on_rec(rec_pipeline):
    root, _, output = rec_pipeline
    assert stages_run(output) == STAGES
    manifest = json.loads((root / "data" / "shards" / "manifest.json").read_text())
    assert manifest["dataset"] == "rec"
    # micro: 16 test samples, 8 out-of-distribution (crowded scenes), 64 train less the 8 held out for val
    assert manifest["splits"]["test"]["kept"] == 16 and manifest["splits"]["test_ood"]["kept"] == 8
    assert manifest["splits"]["train"]["kept"] == 56 and manifest["splits"]["val"]["kept"] == 8


def test_rollouts_hold_recread_records(rec_pipeline):
    root, _, _ = rec_pipeline
    for policy in POLICIES:
        records = read_records(root / "outputs" / "rollouts" / f"{policy}.jsonl")
        assert len(records) == 16
        for record in records:
            assert record["env"] == "rec" and record["policy"] == policy
            truth = record["truth"]
            assert truth["expression"].startswith("the ") and len(truth["bbox_2d"]) == 4
            assert all(isinstance(v, int) and 0 <= v <= 1000 for v in truth["bbox_2d"])
            assert set(record["reward_components"]) == {"format", "iou"} and 0 <= record["reward"] <= 1
            assert {"bbox_2d", "n_boxes", "iou"} <= set(record["parsed"]) and "pred_box" in record
        assert len(read_records(root / "outputs" / "rollouts" / "test_ood" / f"{policy}.jsonl")) == 8


def test_metrics_and_report_name_the_iou_metrics(rec_pipeline):
    root, _, _ = rec_pipeline
    metrics = json.loads((root / "metrics" / "eval.json").read_text())
    for policy in POLICIES:
        assert metrics[policy]["n"] == 16 and metrics[f"{policy}_test_ood"]["n"] == 8
        for name in TASK_METRICS:
            low, point, high = (metrics[policy][f"{name}{end}"] for end in ("_ci_low", "", "_ci_high"))
            assert 0 <= low <= point <= high <= 1, (policy, name)
            assert name in metrics[f"{policy}_test_ood"]
        assert metrics[policy]["accuracy_iou75"] <= metrics[policy]["accuracy_iou50"]
        assert "geoscore" not in metrics[policy] and "accuracy" not in metrics[policy]
    assert all(name in metrics["grpo_minus_sft"] for name in TASK_METRICS)
    table = (root / "reports" / "eval.md").read_text()
    for label in ("| mean IoU |", "| accuracy at IoU 0.5 |", "| accuracy at IoU 0.75 |", "grpo_minus_sft",
                  "crowded scenes of 7-9 objects"):
        assert label in table, label


def test_report_draws_the_boxes_on_the_gallery_images(rec_pipeline):
    root, _, _ = rec_pipeline
    page = (root / "reports" / "eval.html").read_text()
    assert "Environment <b>rec</b>" in page and "<h2>Boxes</h2>" in page
    colours = rec_report.policy_colours(list(POLICIES))
    for policy in POLICIES:
        assert f'<span style="color:{colours[policy]}">{policy}</span>' in page
    # the micro preset's gallery: 8 test samples, each with its image (boxes drawn on by RecEnv.gallery_images)
    cards = re.findall(r'<div class="card" id="sample-[^"]+"><img src="data:image/jpeg;base64,[A-Za-z0-9+/=]+"', page)
    assert len(cards) == 8
