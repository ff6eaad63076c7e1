"""ovd through the whole micro pipeline (`dvc repro`: download, shard, SFT, GRPO, rollout with the blind
baselines, export, evaluate) by the Env API alone: its records, its COCO metrics with intervals and its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pipeline_helpers import STAGES, env_pipeline, read_records, stages_run
from shared_setup import shared_across_workers

POLICIES = ("base", "sft", "grpo")
METRICS = ("map", "ap50", "mean_f1", "exact")


@pytest.fixture(scope="module")
def ovd_pipeline(tmp_path_factory):
    # an answer is about 33 tokens a box with the tiny tokenizer: at most 3 objects, two categories named
    overlay = {"env": {"name": "ovd"}, "data": {"ovd": {"max_objects": 3, "named": 2, "ood_min_objects": 4,
                                                        "ood_max_objects": 5}},
               "eval": {"hf_samples": 2}, "sft": {"max_target_tokens": 112}, "train": {"max_new_tokens": 112},
               "rollout": {"max_new_tokens": 112}}

    def build(folder):
        root, env, output = env_pipeline(folder, overlay)
        return {"root": str(root), "env": env, "output": output}

    built = shared_across_workers(tmp_path_factory, "ovd-pipeline", build)
    return Path(built["root"]), built["env"], built["output"]


def test_every_stage_ran_on_ovd(ovd_pipeline):
    root, _, output = ovd_pipeline
    assert stages_run(output) == STAGES
    manifest = json.loads((root / "data" / "shards" / "manifest.json").read_text())
    assert manifest["dataset"] == "ovd" and manifest["splits"]["test"]["kept"] == 16
    assert all(manifest["splits"][split]["skipped"] == {} for split in manifest["splits"])


def test_records_metrics_and_report(ovd_pipeline):
    root, _, _ = ovd_pipeline
    for policy in POLICIES:
        records = read_records(root / "outputs" / "rollouts" / f"{policy}.jsonl")
        assert len(records) == 16
        for record in records:
            assert record["env"] == "ovd" and 0 <= record["reward"] <= 1
            assert set(record["reward_components"]) == {"f1"} and isinstance(record["pred_boxes"], list | None)
            assert record["truth"]["boxes"] and set(record["truth"]["boxes"][0]) == {"bbox_2d", "label"}
    metrics = json.loads((root / "metrics" / "eval.json").read_text())
    for key in (*POLICIES, "constant", "sft_blind", "grpo_blind"):
        for metric in (*METRICS, "mean_reward"):
            low, point, high = (metrics[key][f"{metric}{end}"] for end in ("_ci_low", "", "_ci_high"))
            assert 0 <= low <= point <= high <= 1, (key, metric)
    assert all(metric in metrics["grpo_minus_sft"] for metric in METRICS)
    table = (root / "reports" / "eval.md").read_text()
    assert "| mAP (IoU 0.5:0.95) |" in table and "| AP50 |" in table
    page = (root / "reports" / "eval.html").read_text()
    assert "Environment <b>ovd</b>" in page and "<h2>Detections</h2>" in page
