"""Mixed-task training runs the whole pipeline: a fresh checkout with the micro preset, `env.name: mixture` over
digits and message_decoding, one `dvc repro`, then its real outputs: each env's raw data and shards, rollout
records per env, metrics per env with intervals and paired differences, a report section per env, and the train
run's per-env figures in MLflow."""

from __future__ import annotations

import json

import pytest
from pipeline_helpers import STAGES, env_pipeline, read_records, stages_run

POLICIES = ("base", "sft", "grpo")
NAMES = ("digits", "message_decoding")
TASK_METRIC = {"digits": "accuracy", "message_decoding": "accuracy"}


@pytest.fixture(scope="module")
def mixture_pipeline(tmp_path_factory):
    overlay = {"env": {"name": "mixture", "mixture": {"envs": {"digits": 3.0, "message_decoding": 1.0}}},
               "eval": {"hf_samples": 2}}
    return env_pipeline(tmp_path_factory.mktemp("mixture"), overlay)


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
    assert not (root / "data" / "shards" / "train").exists()


def test_rollouts_hold_each_envs_records(mixture_pipeline):
    root, _, _ = mixture_pipeline
    summary = json.loads((root / "outputs" / "rollouts" / "summary.json").read_text())
    for name in NAMES:
        for policy in POLICIES:
            records = read_records(root / "outputs" / "rollouts" / name / f"{policy}.jsonl")
            assert len(records) == 16 and {r["env"] for r in records} == {name}
            assert {r["policy"] for r in records} == {policy} and all(0 <= r["reward"] <= 1 for r in records)
            assert len(read_records(root / "outputs" / "rollouts" / name / "test_ood" / f"{policy}.jsonl")) == 8
            assert summary[name][policy]["samples"] == 16
    digits = read_records(root / "outputs" / "rollouts" / "digits" / "sft.jsonl")
    assert all(r["truth"]["task"] in ("sort", "sum") for r in digits)


def test_metrics_and_report_per_env(mixture_pipeline):
    root, _, _ = mixture_pipeline
    metrics = json.loads((root / "metrics" / "eval.json").read_text())
    assert sorted(metrics) == list(NAMES)
    for name in NAMES:
        for key in (*POLICIES, *(f"{p}_test_ood" for p in POLICIES)):
            assert metrics[name][key]["n"] == (8 if key.endswith("ood") else 16), (name, key)
            for metric in (TASK_METRIC[name], "mean_reward", "format_valid_rate"):
                low, point, high = (metrics[name][key][f"{metric}{end}"] for end in ("_ci_low", "", "_ci_high"))
                assert 0 <= low <= point <= high <= 1, (name, key, metric)
        diff = metrics[name]["grpo_minus_sft"]
        assert diff["accuracy_ci_low"] <= diff["accuracy"] <= diff["accuracy_ci_high"]
        assert (root / "reports" / name / "eval.html").exists() and (root / "reports" / name / "eval.md").exists()
    assert "hf_baseline" in metrics["digits"] and "hf_baseline" not in metrics["message_decoding"]
    table = (root / "reports" / "eval.md").read_text()
    html = (root / "reports" / "eval.html").read_text()
    for name in NAMES:
        assert f"## vlmgym evaluation ({name})" in table
        assert f"Environment <b>{name}</b>" in html and f'<section id="{name}">' in html
    assert "| accuracy, sort |" in table and "grpo_minus_sft" in table


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
        assert f"env/{name}/val/reward_greedy" in logged, name  # the val split holds both envs
        shares += [m.value for m in client.get_metric_history(run.info.run_id, f"env/{name}/share")]
    assert shares and all(0 < s <= 1 for s in shares)
    digits = [m for m in logged if m.startswith("env/digits/")]
    assert "env/digits/reward_mean" in digits or "env/message_decoding/reward_mean" in logged
    # each env's training curve in its report folder, read from those figures
    assert any((root / "metrics" / "plots" / name / "train_reward.csv").exists() for name in NAMES)
