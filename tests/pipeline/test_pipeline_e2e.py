"""The whole pipeline end to end: `dvc repro` on the micro preset in a fresh copy of the repository.

One session-scoped run (a few minutes on 2 cores; the `pipeline` fixture in conftest.py) feeds every check:
every stage ran once and wrote its outputs, one MLflow run per stage with lineage tags, a second `dvc repro` is
a no-op, a training param that leaves the weights as they were reruns train only, and one that changes them
reruns train and what follows, nothing upstream.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml
from pipeline_helpers import STAGES, run_checked, stages_run

POLICIES = ["base", "sft", "grpo"]


def _mlflow_runs(root: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vlmgym")
    assert experiment is not None, "no MLflow experiment 'vlmgym'"
    return client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])


def test_every_stage_runs_once_in_order(pipeline):
    assert stages_run(pipeline["first"]) == STAGES


def test_data_and_models(pipeline):
    from vlmgym.data.shards import read_split

    root = pipeline["root"]
    train, test = read_split(root / "data/shards", "train"), read_split(root / "data/shards", "test")
    assert (len(train), len(test)) == (64, 16)
    for name in ("jax/base", "jax/sft", "jax/grpo"):
        assert (root / "models" / name / "vlmgym_checkpoint.json").exists(), name
    from transformers import Qwen3VLForConditionalGeneration

    model = Qwen3VLForConditionalGeneration.from_pretrained(str(root / "models/hf/grpo"), local_files_only=True)
    assert model.config.text_config.num_hidden_layers == 2  # the micro preset's tiny model, not a stale one


def test_rollouts_cover_the_test_split(pipeline):
    from vlmgym.data.shards import read_split
    from vlmgym.eval.records import read_jsonl

    root = pipeline["root"]
    keys = {s.key for s in read_split(root / "data/shards", "test")}
    for policy in POLICIES:
        records = read_jsonl(root / "outputs/rollouts" / f"{policy}.jsonl")
        assert {r["id"] for r in records} == keys and len(records) == len(keys), policy
        for record in records:
            assert record["policy"] == policy and record["env"] == "geospot"
            assert 1 <= len(record["tokens"]) <= 16 and record["finish_reason"] in ("eos", "length")
            assert set(record["truth"]) >= {"latitude", "longitude", "country"}
            assert 0.0 <= record["reward"] <= 1.0 and record["distance_km"] >= 0
    summary = json.loads((root / "outputs/rollouts/summary.json").read_text())
    assert set(summary) == set(POLICIES) and all(s["tokens_per_s"] > 0 for s in summary.values())


def test_metrics_plots_and_reports(pipeline):
    root = pipeline["root"]
    metrics = json.loads((root / "metrics/eval.json").read_text())
    assert set(metrics) == {*POLICIES, "grpo_minus_sft", "hf_baseline"}
    for policy in POLICIES:
        for name in ("geoscore", "mean_km", "median_km", "acc_25km", "acc_country", "format_valid_rate",
                     "mean_reward"):
            assert metrics[policy][f"{name}_ci_low"] <= metrics[policy][name] <= metrics[policy][f"{name}_ci_high"]
        assert metrics[policy]["n"] == 16
    hf = metrics["hf_baseline"]
    # transformers on the exported weights reproduces the JAX engine's greedy answers token for token.
    assert hf["greedy_token_agreement"] == 1.0 and hf["greedy_exact_match"] == 1.0
    assert hf["max_abs_logit_diff"] < 1e-4
    assert hf["hf_tokens_per_s"] > 0 and hf["jax_tokens_per_s"] > 0
    with open(root / "metrics/plots/distance_cdf.csv") as handle:
        assert next(csv.reader(handle)) == ["distance_km", *POLICIES]
    with open(root / "metrics/plots/train_reward.csv") as handle:
        assert [int(row["step"]) for row in csv.DictReader(handle)] == [1, 2]  # train.steps: 2
    page = (root / "reports/eval.html").read_text()
    assert "data:image/jpeg;base64," in page and "data:image/png;base64," in page and "hf_baseline" in page
    assert "grpo_minus_sft" in (root / "reports/eval.md").read_text()
    for sections in (yaml.safe_load((root / "metrics/sft.json").read_text()),
                     yaml.safe_load((root / "metrics/train.json").read_text())):
        assert sections


def test_one_mlflow_run_per_stage_with_lineage(pipeline):
    root = pipeline["root"]
    runs = _mlflow_runs(root)
    assert [r.data.tags["vlmgym.stage"] for r in runs] == STAGES
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert len({r.data.tags["vlmgym.pipeline_id"] for r in runs}) == 1  # one `dvc repro`
    by_stage = {r.data.tags["vlmgym.stage"]: r for r in runs}
    spec = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    for stage, run in by_stage.items():
        assert run.data.tags["git.commit"] != "unknown"
        for out in spec[stage].get("outs", []) + spec[stage].get("metrics", []):
            out = out if isinstance(out, str) else next(iter(out))
            assert f"dvc.out.{out}" in run.data.tags, (stage, out)
        assert any(tag.startswith("dvc.dep.") for tag in run.data.tags), stage
    # evaluate's training curve came from the train run that wrote models/jax/grpo.
    assert by_stage["evaluate"].data.tags["vlmgym.train_run_id"] == by_stage["train"].info.run_id
    assert "grpo/geoscore" in by_stage["evaluate"].data.metrics
    assert "hf_baseline/greedy_token_agreement" in by_stage["evaluate"].data.metrics


def test_second_repro_is_a_no_op_and_train_param_reruns_downstream(pipeline):
    root, env = pipeline["root"], pipeline["env"]
    lock = (root / "dvc.lock").read_bytes()
    again = run_checked(["dvc", "repro"], root, env)
    assert stages_run(again.stdout) == []
    assert (root / "dvc.lock").read_bytes() == lock
    assert len(_mlflow_runs(root)) == len(STAGES)
    before = yaml.safe_load(lock)["stages"]
    # The micro preset's two GRPO steps see only groups whose rewards are all equal (zero advantages), so a
    # doubled lr reruns train but gives the same weights; the model folder's bytes are equal, so DVC reruns
    # nothing after it.
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["lr"] = params["train"]["lr"] * 2
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    same = run_checked(["dvc", "repro"], root, env)
    assert stages_run(same.stdout) == ["train"]
    middle = yaml.safe_load((root / "dvc.lock").read_bytes())["stages"]
    assert middle["train"]["params"]["params.yaml"]["train"]["lr"] == params["train"]["lr"]
    assert middle["train"]["outs"] == before["train"]["outs"]
    # Weight decay moves the matrices even with zero advantages: new weights, and what follows them reruns.
    params["train"]["weight_decay"] = 0.5
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    rerun = run_checked(["dvc", "repro"], root, env)
    assert stages_run(rerun.stdout) == ["train", "rollout", "export", "evaluate"]
    after = yaml.safe_load((root / "dvc.lock").read_bytes())["stages"]
    for stage in ("download", "shard", "base_model", "convert", "sft"):
        assert after[stage] == before[stage], stage
    assert after["train"]["outs"] != before["train"]["outs"]  # new weights
    runs = _mlflow_runs(root)
    assert [r.data.tags["vlmgym.stage"] for r in runs[len(STAGES):]] == ["train", "train", "rollout", "export",
                                                                           "evaluate"]
