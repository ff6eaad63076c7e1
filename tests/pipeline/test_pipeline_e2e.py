"""The whole pipeline end to end: `dvc repro` on the micro preset in a fresh copy of the repository.

One session-scoped run (a few minutes on 2 cores; the `pipeline` fixture in conftest.py) feeds every check:
every stage ran once and wrote its outputs, `dvc repro -f` from scratch writes every output byte for byte again
(so git status stays clean), one MLflow parent run per pipeline with one nested run per stage with lineage tags,
the registered model answers as the JAX engine did, a second `dvc repro` is a no-op, a training param that
leaves the weights as they were reruns train and (its curve file changed) evaluate only, and one that changes them
reruns train and what follows, nothing upstream.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from pipeline_helpers import STAGES, copy_of, output_digests, run_checked, stages_run

from vlmgym.tracking import pipeline_run

POLICIES = ["base", "sft", "grpo"]
BASELINES = ["constant", "sft_blind", "grpo_blind"]  # the image-blind baselines (vlmgym.eval.blind)
BLIND_PAIRS = ["sft_minus_constant", "sft_minus_sft_blind", "grpo_minus_constant", "grpo_minus_grpo_blind"]


def _all_runs(root: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vlmgym")
    assert experiment is not None, "no MLflow experiment 'vlmgym'"
    return client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])


def _is_parent(run) -> bool:
    return run.data.tags.get(pipeline_run.ROLE_TAG) == pipeline_run.PIPELINE_ROLE


def _mlflow_runs(root: Path) -> list:
    """The stage runs, oldest first."""
    return [r for r in _all_runs(root) if not _is_parent(r)]


def test_every_stage_runs_once_in_order(pipeline):
    assert stages_run(pipeline["first"]) == STAGES


def test_data_and_models(pipeline):
    from vlmgym.data.shards import read_split

    root = pipeline["root"]
    train, val, test, ood = (read_split(root / "data/shards", split) for split in ("train", "val", "test", "test_ood"))
    assert (len(train), len(val), len(test), len(ood)) == (56, 8, 16, 8)  # shard.val_samples: 8 held out of the 64
    assert not {s.key for s in ood} & {s.key for s in [*train, *val, *test]}
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
    # the out-of-distribution split (micro: data.ood_images 8, fog), answered greedy beside test
    ood_keys = {s.key for s in read_split(root / "data/shards", "test_ood")}
    for policy in POLICIES:
        records = read_jsonl(root / "outputs/rollouts/test_ood" / f"{policy}.jsonl")
        assert {r["id"] for r in records} == ood_keys and all(r["policy"] == policy for r in records)
    summary = json.loads((root / "outputs/rollouts/summary.json").read_text())
    assert set(summary) == {*POLICIES, *BASELINES}
    greedy = {"answers", "format_ok_rate", "generated_tokens", "mean_reward", "samples", "test_ood_mean_reward",
              "test_ood_samples"}
    for policy in (*POLICIES, "sft_blind", "grpo_blind"):  # no speeds: they differ on every run (they are in MLflow)
        assert set(summary[policy]) == greedy | ({"sampled_mean_reward"} if policy in POLICIES else set()), policy
        assert summary[policy]["test_ood_samples"] == 8
    # the text-only policy answered every sample of both splits; the constant gave one answer, chosen on val
    for split in ("", "test_ood/"):
        for policy in ("sft_blind", "grpo_blind", "constant"):
            assert len(read_jsonl(root / f"outputs/rollouts/{split}{policy}.jsonl")) == (8 if split else 16)
    constant = summary["constant"]
    assert constant["chosen_on"] == "val" and 1 <= constant["candidates"] <= 8
    answers = {r["answer"] for r in read_jsonl(root / "outputs/rollouts/constant.jsonl")}
    assert answers == {constant["answer"]} and constant["answer"].count("\n") == 4  # a five-line geospot answer
    for policy in POLICIES:  # rollout.sampled_answers: 4 per test prompt
        sampled = read_jsonl(root / "outputs/rollouts" / f"{policy}.sampled.jsonl")
        assert len(sampled) == 4 * 16 and {r["sample"] for r in sampled} == {0, 1, 2, 3}


def test_metrics_plots_and_reports(pipeline):
    from vlmgym.eval.records import read_jsonl

    root = pipeline["root"]
    metrics = json.loads((root / "metrics/eval.json").read_text())
    columns = (*POLICIES, *BASELINES, "grpo_minus_sft", *BLIND_PAIRS)
    assert set(metrics) == {*columns, "hf_baseline", *(f"{key}_test_ood" for key in columns)}
    for policy in POLICIES:  # sampled answers: the mean over each prompt's 4, beside greedy (geospot: no pass@k)
        assert "sampled_mean_reward" in metrics[policy] and "pass_at_k" not in metrics[policy]
        assert metrics[policy]["best_of_k_reward"] >= metrics[policy]["sampled_mean_reward"]
    assert "sampled_mean_reward" not in metrics["constant"]
    for policy in POLICIES:
        assert metrics[f"{policy}_test_ood"]["n"] == 8
        ood_rewards = [r["reward"] for r in read_jsonl(root / "outputs/rollouts/test_ood" / f"{policy}.jsonl")]
        assert metrics[f"{policy}_test_ood"]["mean_reward"] == pytest.approx(sum(ood_rewards) / len(ood_rewards))
    for policy in POLICIES:
        for name in ("geoscore", "mean_km", "median_km", "acc_25km", "acc_country", "format_valid_rate",
                     "mean_reward"):
            assert metrics[policy][f"{name}_ci_low"] <= metrics[policy][name] <= metrics[policy][f"{name}_ci_high"]
        assert metrics[policy]["n"] == 16
    hf = metrics["hf_baseline"]
    # transformers on the exported weights reproduces the JAX engine's greedy answers token for token.
    assert hf["greedy_token_agreement"] == 1.0 and hf["greedy_exact_match"] == 1.0
    assert hf["max_abs_logit_diff"] < 1e-4
    assert not {"hf_tokens_per_s", "hf_seconds", "jax_tokens_per_s"} & set(hf)  # speeds are in MLflow
    with open(root / "metrics/plots/distance_cdf.csv") as handle:
        assert next(csv.reader(handle)) == ["distance_km", *POLICIES]
    with open(root / "metrics/plots/train_reward.csv") as handle:
        assert [int(row["step"]) for row in csv.DictReader(handle)] == [1, 2]  # train.steps: 2
    page = (root / "reports/eval.html").read_text()
    assert "data:image/jpeg;base64," in page and "data:image/png;base64," in page and "hf_baseline" in page
    table = (root / "reports/eval.md").read_text()
    assert "grpo_minus_sft" in table and "| sft (test) | sft (test_ood) |" in table
    assert "Image-blind check" in table and "sft - constant (test_ood)" in table
    assert "| metric | base | sft | grpo | constant | sft_blind | grpo_blind | grpo_minus_sft |" in table
    assert "test_ood: test's places rendered in fog at strength 0.5 (data.geospot.ood_shift)" in table  # configured
    assert "grpo_minus_sft (test_ood)" in page
    for sections in (yaml.safe_load((root / "metrics/sft.json").read_text()),
                     yaml.safe_load((root / "metrics/train.json").read_text())):
        assert sections


def test_one_mlflow_run_per_stage_with_lineage(pipeline):
    root = pipeline["root"]
    runs = _mlflow_runs(root)[:len(STAGES)]  # the first `dvc repro`
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
    # The lineage tags link evaluate to the train run that wrote the model and the curves it drew.
    for path in ("models/jax/grpo", "metrics/curves/train.jsonl"):
        assert by_stage["evaluate"].data.tags[f"dvc.dep.{path}"] == by_stage["train"].data.tags[f"dvc.out.{path}"]
    assert "grpo/geoscore" in by_stage["evaluate"].data.metrics
    assert "hf_baseline/greedy_token_agreement" in by_stage["evaluate"].data.metrics
    # Measured speeds are here, not in the DVC outputs.
    assert by_stage["evaluate"].data.metrics["hf_baseline/hf_tokens_per_s"] > 0
    assert all(by_stage["rollout"].data.metrics[f"{p}/tokens_per_s"] > 0 for p in POLICIES)
    # The shards are the training runs' dataset input, with DVC's hash as digest.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    for stage in ("sft", "train"):
        inputs = client.get_run(by_stage[stage].info.run_id).inputs.dataset_inputs
        assert [(i.dataset.name, i.dataset.digest) for i in inputs] == [
            ("data/shards", by_stage[stage].data.tags["dvc.dep.data/shards"])], stage


def test_each_pipeline_is_one_parent_run_with_its_stages_and_results(pipeline):
    """`mlflow ui` nests each `dvc repro`'s stage runs under its parent, which holds every section of
    params.yaml and the evaluate stage's results: one row per pipeline in the experiment table."""
    import mlflow

    root = pipeline["root"]
    runs = _all_runs(root)
    parents = [r for r in runs if _is_parent(r)]
    assert len(parents) == 1  # the fixture's one `dvc repro`
    for parent in parents:
        children = [r for r in runs if r.data.tags.get(pipeline_run.PARENT_TAG) == parent.info.run_id]
        assert sorted(r.data.tags["vlmgym.stage"] for r in children) == sorted(STAGES)
        assert parent.info.status == "FINISHED"
        assert {r.data.tags["vlmgym.pipeline_id"] for r in children} == {parent.data.tags["vlmgym.pipeline_id"]}
        sections = yaml.safe_load((root / "params.yaml").read_text())
        assert {key.split(".")[0] for key in parent.data.params} == set(sections)
        evaluate = next(r for r in children if r.data.tags["vlmgym.stage"] == "evaluate")
        assert parent.data.metrics["grpo/geoscore"] == evaluate.data.metrics["grpo/geoscore"]
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    table = mlflow.search_runs(experiment_names=["vlmgym"], filter_string="tags.`vlmgym.role` = 'pipeline'")
    assert set(table["run_id"]) == {p.info.run_id for p in parents}
    assert {"params.train.optimizer.lr", "metrics.grpo/geoscore"} <= set(table.columns)


def test_registered_model_answers_as_the_jax_engine(pipeline):
    """Each export is a version of the registered model `vlmgym-geospot`, with lineage; loaded with mlflow
    (transformers underneath) it gives the JAX engine's greedy answer to a test prompt."""
    import io

    import mlflow
    from mlflow.tracking import MlflowClient

    from vlmgym.data.shards import read_split
    from vlmgym.envs.geospot.env import PROMPT
    from vlmgym.eval.records import read_jsonl

    root = pipeline["root"]
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    version = client.get_model_version("vlmgym-geospot", "1")
    export = client.get_run(version.run_id)
    assert export.data.tags["vlmgym.stage"] == "export"
    assert version.tags["dvc.hash"] == export.data.tags["dvc.out.models/hf/grpo"]
    assert version.tags["vlmgym.pipeline_id"] == export.data.tags["vlmgym.pipeline_id"]
    assert version.tags["git.commit"] == export.data.tags["git.commit"]
    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model("models:/vlmgym-geospot/1")
    record = read_jsonl(root / "outputs/rollouts/grpo.jsonl")[0]
    (sample,) = [s for s in read_split(root / "data/shards", "test") if s.key == record["id"]]
    encoded = io.BytesIO()
    sample.images[0].save(encoded, format="PNG")  # lossless: the pixels the engine saw
    assert model.predict([{"image": encoded.getvalue(), "prompt": PROMPT}]) == [record["answer"]]


def test_the_evaluated_export_is_the_champion_and_loads_without_warnings(pipeline):
    """The evaluate stage records the grpo policy's mean reward on the version it evaluated (the export of the same
    `dvc repro`) and, the model having no champion yet, gives it the alias `champion`; the model loaded from
    `models:/vlmgym-geospot@champion` has its signature and input example, and MLflow warns about nothing."""
    import logging
    import warnings

    import mlflow
    from mlflow.tracking import MlflowClient

    root = pipeline["root"]
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    version = client.get_model_version_by_alias("vlmgym-geospot", "champion")
    assert version.version in (1, "1")
    evaluate = next(r for r in _mlflow_runs(root) if r.data.tags["vlmgym.stage"] == "evaluate")
    assert version.tags["vlmgym.eval.run_id"] == evaluate.info.run_id
    assert float(version.tags["vlmgym.eval.mean_reward"]) == evaluate.data.metrics["grpo/mean_reward"]
    assert "vlmgym-geospot version 1 (mean_reward" in pipeline["first"]  # the stage said so
    mlflow.set_tracking_uri(uri)

    class Records(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.records = []

        def emit(self, record):
            self.records.append(record.getMessage())

    logged = Records()
    logging.getLogger("mlflow").addHandler(logged)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = mlflow.pyfunc.load_model("models:/vlmgym-geospot@champion")
    finally:
        logging.getLogger("mlflow").removeHandler(logged)
    assert [str(w.message) for w in caught] + logged.records == []
    assert {c.name for c in model.metadata.signature.inputs.inputs} == {"image", "prompt"}
    assert model.metadata.saved_input_example_info is not None


def test_second_repro_is_a_no_op_and_a_train_param_makes_what_follows_stale(pipeline, tmp_path):
    root, env = copy_of(pipeline, tmp_path / "checkout")
    lock = (root / "dvc.lock").read_bytes()
    again = run_checked(["dvc", "repro"], root, env)
    assert stages_run(again.stdout) == []
    assert (root / "dvc.lock").read_bytes() == lock
    assert len(_mlflow_runs(root)) == len(STAGES)  # the fixture's pipeline
    before = yaml.safe_load(lock)["stages"]
    # The micro preset's two GRPO steps see only groups whose rewards are all equal (zero advantages), so a
    # doubled lr reruns train but gives the same weights; the model folder's bytes are equal, so DVC reruns
    # nothing that reads it. The train stage's curve file holds each step's learning rate: evaluate, which draws
    # its training curves from it, reruns, and writes the same report (the rewards are the same).
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["optimizer"]["lr"] = params["train"]["optimizer"]["lr"] * 2
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    same = run_checked(["dvc", "repro"], root, env)
    assert stages_run(same.stdout) == ["train", "evaluate"]
    middle = yaml.safe_load((root / "dvc.lock").read_bytes())["stages"]
    assert middle["train"]["params"]["params.yaml"]["train"]["optimizer"] == params["train"]["optimizer"]

    def model_out(stages: dict) -> list:
        return [out for out in stages["train"]["outs"] if out["path"] == "models/jax/grpo"]

    assert model_out(middle) == model_out(before)
    report = ("reports/", "metrics/eval.json", "metrics/plots/")
    assert ({path: md5 for path, md5 in output_digests(root).items() if path.startswith(report)}
            == {path: md5 for path, md5 in pipeline["digests"].items() if path.startswith(report)})
    # Weight decay moves the matrices even with zero advantages: new weights, and everything that reads them is
    # out of date (`dvc status`: what the next `dvc repro` reruns; running it is the fixture's first run again).
    params["train"]["optimizer"]["weight_decay"] = 0.5
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    rerun = run_checked(["dvc", "repro", "train"], root, env)
    assert stages_run(rerun.stdout) == ["train"]
    after = yaml.safe_load((root / "dvc.lock").read_bytes())["stages"]
    for stage in ("download", "shard", "base_model", "convert", "sft"):
        assert after[stage] == before[stage], stage
    assert after["train"]["outs"] != before["train"]["outs"]  # new weights
    # the pipeline's own stages (the checkout also holds the studies' dvc.yaml files, which have not run)
    stale = json.loads(run_checked(["dvc", "status", "--json", "dvc.yaml"], root, env).stdout)
    assert sorted(stale) == ["evaluate", "export", "rollout"]
    runs = _mlflow_runs(root)
    assert [r.data.tags["vlmgym.stage"] for r in runs[len(STAGES):]] == ["train", "evaluate", "train"]
