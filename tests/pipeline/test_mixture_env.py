"""The built-in r1_vlm and VLM-R1 envs run the whole pipeline in one micro run: a fresh checkout with the micro
preset, `env.name: mixture` over digits (with the R1 think/answer option on), message_decoding and rec, one
`dvc repro`; then each env's real outputs: raw data and shards, rollout records, its own metrics with intervals
and paired differences, its report section and rows, and the train run's per-env figures in MLflow.

One run carries the three envs (and mixed-task training itself) at the cost of one: each env's data, reward,
metrics and report are its own code whether it runs alone or in a mixture; what a single env adds (the shards and
outputs at the top of data/ and outputs/) is what the geospot and plug-in pipeline tests run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pipeline_helpers import STAGES, env_pipeline, read_records, stages_run
from shared_setup import shared_across_workers

from vlmgym.envs.message_decoding.env import length_group
from vlmgym.envs.rec import report as rec_report

POLICIES = ("base", "sft", "grpo")
NAMES = ("digits", "message_decoding", "rec")
# each env's own metrics (besides mean_reward and format_valid_rate), every one a rate with an interval
TASK_METRICS = {"digits": ("accuracy", "accuracy_sort", "accuracy_sum"),
                "message_decoding": ("accuracy", "char_accuracy"),
                "rec": ("mean_iou", "accuracy_iou50", "accuracy_iou75")}
# rows of each env's table and its out-of-distribution heading (the configured shift, micro preset's settings)
REPORT_LABELS = {"digits": ("| accuracy |", "| accuracy, sort |", "| accuracy, sum |", "inverted colours"),
                 "message_decoding": ("| accuracy |", "| character accuracy |",
                                      "words of 9-10 letters, longer than train ever uses"),
                 "rec": ("| mean IoU |", "| accuracy at IoU 0.5 |", "| accuracy at IoU 0.75 |",
                         "crowded scenes of 7-9 objects")}


@pytest.fixture(scope="module")
def mixture_pipeline(tmp_path_factory):
    # think on: digits' tagged SFT target is ~20 tokens, so training and rollouts get room for it
    overlay = {"env": {"name": "mixture", "mixture": {"envs": {"digits": 2.0, "message_decoding": 1.0, "rec": 1.0}},
                       "digits": {"think": True}},
               "eval": {"hf_samples": 2}, "train": {"max_new_tokens": 32}, "rollout": {"max_new_tokens": 32}}

    def build(folder):
        root, env, output = env_pipeline(folder, overlay)
        return {"root": str(root), "env": env, "output": output}

    built = shared_across_workers(tmp_path_factory, "mixture-pipeline", build)  # one run, whichever worker asks
    return Path(built["root"]), built["env"], built["output"]


def test_every_stage_ran_with_each_envs_data(mixture_pipeline):
    root, _, output = mixture_pipeline
    assert stages_run(output) == STAGES
    top = json.loads((root / "data" / "shards" / "manifest.json").read_text())
    assert sorted(top["parts"]) == list(NAMES)
    for name in NAMES:
        assert (root / "data" / "raw" / name / "train.csv").exists()
        manifest = json.loads((root / "data" / "shards" / name / "manifest.json").read_text())
        assert manifest["dataset"] == name and manifest == top["parts"][name]
        # micro: 16 test samples and 8 out-of-distribution per env; 64 train less the 8 held out for val
        assert manifest["splits"]["test"]["kept"] == 16 and manifest["splits"]["test_ood"]["kept"] == 8
        assert manifest["splits"]["train"]["kept"] == 56 and manifest["splits"]["val"]["kept"] == 8
        assert sorted(p.name for p in (root / "data" / "shards" / name / "test").glob("*.tar"))
    assert not (root / "data" / "shards" / "train").exists()


def _check_digits(record):
    assert record["truth"]["task"] in ("sort", "sum") and 1 <= len(record["truth"]["digits"]) <= 3
    # the think option reached the env: its structure component is scored
    assert set(record["reward_components"]) == {"format", "correct", "think_format"}
    assert record["reward_components"]["think_format"] in (0.0, 0.1) and "numbers" in record["parsed"]


def _check_message_decoding(record):
    truth = record["truth"]
    assert 3 <= len(truth["answer"]) <= 8 and sorted(truth["decoder"]) == sorted("abcdefghijklmnopqrstuvwxyz")
    assert "".join(truth["decoder"][ord(c) - ord("a")] for c in truth["coded"]) == truth["answer"]
    assert set(record["reward_components"]) == {"format", "correct"} and "word" in record["parsed"]


def _check_rec(record):
    truth = record["truth"]
    assert truth["expression"].startswith("the ") and len(truth["bbox_2d"]) == 4
    assert all(isinstance(v, int) and 0 <= v <= 1000 for v in truth["bbox_2d"])
    assert set(record["reward_components"]) == {"format", "iou"}
    assert {"bbox_2d", "n_boxes", "iou"} <= set(record["parsed"]) and "pred_box" in record


RECORD_CHECKS = {"digits": _check_digits, "message_decoding": _check_message_decoding, "rec": _check_rec}


def test_rollouts_hold_each_envs_records(mixture_pipeline):
    root, _, _ = mixture_pipeline
    summary = json.loads((root / "outputs" / "rollouts" / "summary.json").read_text())
    for name in NAMES:
        for policy in POLICIES:
            records = read_records(root / "outputs" / "rollouts" / name / f"{policy}.jsonl")
            assert len(records) == 16 and summary[name][policy]["samples"] == 16
            for record in records:
                assert record["env"] == name and record["policy"] == policy and 0 <= record["reward"] <= 1
                RECORD_CHECKS[name](record)
            ood = read_records(root / "outputs" / "rollouts" / name / "test_ood" / f"{policy}.jsonl")
            assert len(ood) == 8 and {r["env"] for r in ood} == {name}
            if name == "message_decoding":  # the shift: words longer than train's 3-8 letters
                assert all(9 <= len(r["truth"]["answer"]) <= 10 for r in ood)


def _metric_names(root, name):
    """Each env's metrics, with the groups this run's test samples fall in (digit counts, word lengths)."""
    sft = read_records(root / "outputs" / "rollouts" / name / "sft.jsonl")
    if name == "digits":
        return [*TASK_METRICS[name], *(f"accuracy_{n}digit" for n in sorted({len(r["truth"]["digits"]) for r in sft}))]
    if name == "message_decoding":
        return [*TASK_METRICS[name], *sorted({length_group(len(r["truth"]["answer"])) for r in sft})]
    return list(TASK_METRICS[name])


def test_metrics_and_report_per_env(mixture_pipeline):
    root, _, _ = mixture_pipeline
    metrics = json.loads((root / "metrics" / "eval.json").read_text())
    assert sorted(metrics) == list(NAMES)
    for name in NAMES:
        for key in (*POLICIES, *(f"{p}_test_ood" for p in POLICIES)):
            assert metrics[name][key]["n"] == (8 if key.endswith("ood") else 16), (name, key)
            for metric in ("mean_reward", "format_valid_rate", *TASK_METRICS[name]):
                low, point, high = (metrics[name][key][f"{metric}{end}"] for end in ("_ci_low", "", "_ci_high"))
                assert 0 <= low <= point <= high <= 1, (name, key, metric)
        for policy in POLICIES:
            for metric in _metric_names(root, name):  # the groups only where the test split has samples of them
                low, point, high = (metrics[name][policy][f"{metric}{end}"] for end in ("_ci_low", "", "_ci_high"))
                assert 0 <= low <= point <= high <= 1, (name, policy, metric)
            assert "geoscore" not in metrics[name][policy]
        diff = metrics[name]["grpo_minus_sft"]
        assert all(metric in diff for metric in TASK_METRICS[name])
        first = TASK_METRICS[name][0]
        assert diff[f"{first}_ci_low"] <= diff[first] <= diff[f"{first}_ci_high"]
        for label in (*REPORT_LABELS[name], "grpo_minus_sft"):
            assert label in (root / "reports" / name / "eval.md").read_text(), (name, label)
        assert (root / "reports" / name / "eval.html").exists()
    rec = metrics["rec"]
    assert all(rec[p]["accuracy_iou75"] <= rec[p]["accuracy_iou50"] for p in POLICIES)
    assert "accuracy" not in rec["sft"] and "accuracy_9to10" not in metrics["message_decoding"]["sft"]
    assert "hf_baseline" in metrics["digits"] and "hf_baseline" not in metrics["message_decoding"]
    table = (root / "reports" / "eval.md").read_text()
    html = (root / "reports" / "eval.html").read_text()
    for name in NAMES:
        assert f"## vlmgym evaluation ({name})" in table
        assert f"Environment <b>{name}</b>" in html and f'<section id="{name}">' in html


def test_rec_report_draws_the_boxes_on_its_gallery_images(mixture_pipeline):
    root, _, _ = mixture_pipeline
    page = (root / "reports" / "rec" / "eval.html").read_text()
    assert "Environment <b>rec</b>" in page and "<h2>Boxes</h2>" in page
    colours = rec_report.policy_colours(list(POLICIES))
    for policy in POLICIES:
        assert f'<span style="color:{colours[policy]}">{policy}</span>' in page
    # the micro preset's gallery: 8 test samples, each with its image (boxes drawn on by RecEnv.gallery_images)
    cards = re.findall(r'<div class="card" id="sample-[^"]+"><img src="data:image/jpeg;base64,[A-Za-z0-9+/=]+"', page)
    assert len(cards) == 8


def test_train_run_logs_each_envs_figures(mixture_pipeline):
    from mlflow.tracking import MlflowClient

    root, _, _ = mixture_pipeline
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vlmgym")
    run = client.search_runs([experiment.experiment_id], filter_string="tags.`vlmgym.stage` = 'train'")[0]
    logged = set(run.data.metrics)
    assert {"reward_mean", "final_reward_mean", "val/reward_greedy"} <= logged
    shares = []
    for name in NAMES:
        assert f"env/{name}/val/reward_greedy" in logged, name  # the val split holds every env
        shares += [m.value for m in client.get_metric_history(run.info.run_id, f"env/{name}/share")]
    assert shares and all(0 < s <= 1 for s in shares)
    assert any(f"env/{name}/reward_mean" in logged for name in NAMES)
    # each env's training curve in its report folder, read from those figures
    assert any((root / "metrics" / "plots" / name / "train_reward.csv").exists() for name in NAMES)
