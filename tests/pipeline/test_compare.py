"""`vlmgym compare` end to end on the micro pipeline (in a copy of it): every arm trains from the sft model,
answers the test split, and the paired comparison lands in outputs/compare/ and one MLflow run; a second call
reuses every arm. With --seeds 2 each seed trains its own start and arm, and the figures are over seeds."""

from __future__ import annotations

import json
import shutil

import pytest
from pipeline_helpers import run_checked

ARMS = ["sft_longer", "grpo", "ppo", "dpo"]
# a variant arm: GRPO with only the top half of tokens by entropy carrying the loss, from the same start and budget
VARIANT = ["--variant", "entropy_top50=top_entropy_quantile=0.5"]
TRAINED = [*ARMS, "entropy_top50"]


def test_compare_trains_every_arm_and_writes_the_paired_comparison(pipeline, tmp_path):
    from mlflow.tracking import MlflowClient

    root = tmp_path / "compare"
    shutil.copytree(pipeline["root"], root, symlinks=True)
    env = {**pipeline["env"], "PYTHONPATH": str(root / "src"), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    status_before = run_checked(["dvc", "status"], root, env).stdout
    first = run_checked(["vlmgym", "compare", "--arms", *ARMS, *VARIANT], root, env, timeout=1200)
    out = root / "outputs/compare"
    results = json.loads((out / "compare.json").read_text())
    assert list(results) == ["test", "test_ood"]  # micro: 8 OOD samples (fog)
    test = results["test"]
    assert set(results["test_ood"]) == set(test) and results["test_ood"]["dpo_minus_sft"]["n"] == 8
    for arm in TRAINED:
        assert len((out / arm / "test_ood.jsonl").read_text().splitlines()) == 8
    baselines = ["constant", "sft_blind"]  # the image-blind baselines beside the arms
    assert set(test) == {"sft", *TRAINED, *baselines, *(f"{p}_minus_sft" for p in TRAINED), "entropy_top50_minus_grpo",
                         *(f"sft_minus_{b}" for b in baselines)}
    assert test["sft_minus_constant"]["mean_reward"] == pytest.approx(
        test["sft"]["mean_reward"] - test["constant"]["mean_reward"])
    constant = [json.loads(line)["answer"] for line in (out / "constant/test.jsonl").read_text().splitlines()]
    assert len(constant) == 16 and len(set(constant)) == 1  # one answer for every sample
    assert len((out / "sft_blind/test_ood.jsonl").read_text().splitlines()) == 8
    for arm in TRAINED:
        difference = test[f"{arm}_minus_sft"]
        assert difference["n"] == 16  # paired on every test sample
        assert difference["mean_reward"] == pytest.approx(test[arm]["mean_reward"] - test["sft"]["mean_reward"])
        assert difference["mean_reward_ci_low"] <= difference["mean_reward"] <= difference["mean_reward_ci_high"]
        assert (out / arm / "model" / "vlmgym_checkpoint.json").exists()
        assert len((out / arm / "test.jsonl").read_text().splitlines()) == 16
    table = (out / "compare.md").read_text()
    assert "## test" in table and "## test_ood (test's places rendered in fog" in table and "dpo_minus_sft" in table
    assert "sampled completions" in table and "# Algorithm comparison (geospot, 1 seed)" in table
    assert "Variants: `entropy_top50` is grpo with top_entropy_quantile = 0.5. `<variant>_minus_grpo`" in table
    assert test["entropy_top50_minus_grpo"]["mean_reward"] == pytest.approx(
        test["entropy_top50"]["mean_reward"] - test["grpo"]["mean_reward"])
    assert "## Mean reward, every split" in table and "| policy | test | test_ood |" in table
    assert "1 seed: intervals over test samples only" in table and "on each seed" not in table
    assert "| metric | sft_longer_minus_sft (test) | sft_longer_minus_sft (test_ood) | grpo_minus_sft (test) |" in table
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert first.stdout.strip().endswith(table.strip().splitlines()[-1])  # the table is printed too
    # The pipeline's own outputs are untouched.
    assert run_checked(["dvc", "status"], root, env).stdout == status_before

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vlmgym")
    parent = client.search_runs([experiment.experiment_id], filter_string="tags.`vlmgym.role` = 'compare'")[0]
    assert parent.info.status == "FINISHED" and parent.data.metrics["test/ppo_minus_sft/mean_reward"] == (
        test["ppo_minus_sft"]["mean_reward"])
    assert parent.data.params["variant.entropy_top50"] == "top_entropy_quantile=0.5"
    arms = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(r.data.tags["vlmgym.arm"] for r in arms) == sorted(["sft", *TRAINED])
    trained = {r.data.tags["vlmgym.arm"]: r for r in arms}
    assert "value_loss" in trained["ppo"].data.metrics and "dpo_pairs" in trained["dpo"].data.metrics
    assert "loss" in trained["sft_longer"].data.metrics and "val/reward_greedy" in trained["grpo"].data.metrics
    # the variant's learner masked tokens by entropy; grpo's did not
    assert "entropy_kept" in trained["entropy_top50"].data.metrics
    assert "entropy_kept" not in trained["grpo"].data.metrics

    again = run_checked(["vlmgym", "compare", "--arms", *ARMS, *VARIANT], root, env, timeout=600)
    assert all(f"compare: {arm}: reusing" in again.stdout for arm in ["sft", *TRAINED])
    assert json.loads((out / "compare.json").read_text()) == results


def test_compare_with_two_seeds_trains_a_start_and_an_arm_per_seed_and_reports_over_seeds(pipeline, tmp_path):
    from mlflow.tracking import MlflowClient

    root = tmp_path / "seeds"
    shutil.copytree(pipeline["root"], root, symlinks=True)
    env = {**pipeline["env"], "PYTHONPATH": str(root / "src"), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    out = root / "outputs/compare"
    # one seed alone, as a process beside the others would run it: no report
    alone = run_checked(["vlmgym", "compare", "--seeds", "2", "--only-seed", "1", "--arms", "grpo"], root, env,
                        timeout=1200)
    assert "compare: seed 1 done" in alone.stdout and not (out / "compare.json").exists()
    assert not (out / "seed0").exists() and (out / "seed1/grpo/done.json").exists()
    full = run_checked(["vlmgym", "compare", "--seeds", "2", "--arms", "grpo"], root, env, timeout=1200)
    assert "compare: grpo: reusing outputs/compare/seed1/grpo" in full.stdout
    # seed 0 is the configured sft.seed: the pipeline's SFT model answers; seed 1 trains its own from the base
    assert not (out / "seed0/sft/model").exists() and (out / "seed1/sft/model/vlmgym_checkpoint.json").exists()
    assert all((out / f"seed{s}/grpo/model/vlmgym_checkpoint.json").exists() for s in (0, 1))
    assert (root / "checkpoints/compare/seed1/sft").is_dir() and (root / "checkpoints/compare/seed1/grpo").is_dir()
    results = json.loads((out / "compare.json").read_text())
    assert list(results) == ["test", "test_ood"]
    difference = results["test"]["grpo_minus_sft"]
    assert difference["seeds"] == 2 and difference["n"] == 16
    seeds = [difference["mean_reward_seed0"], difference["mean_reward_seed1"]]
    assert difference["mean_reward"] == pytest.approx(sum(seeds) / 2)
    assert difference["mean_reward_ci_low"] <= difference["mean_reward"] <= difference["mean_reward_ci_high"]
    table = (out / "compare.md").read_text()
    assert "# Algorithm comparison (geospot, 2 seeds)" in table and "two-level bootstrap" in table
    assert "### test: mean reward on each seed" in table and "| policy | seed 0 | seed 1 | mean |" in table

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vlmgym")
    parent = client.search_runs([experiment.experiment_id], filter_string="tags.`vlmgym.role` = 'compare'")[0]
    assert parent.data.params["seeds"] == "2"
    assert parent.data.metrics["test/grpo_minus_sft/mean_reward_seed1"] == seeds[1]
    arms = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted((r.data.tags["vlmgym.seed"], r.data.tags["vlmgym.arm"]) for r in arms) == [
        ("0", "grpo"), ("0", "sft"), ("1", "grpo"), ("1", "sft")]

    again = run_checked(["vlmgym", "compare", "--seeds", "2", "--arms", "grpo"], root, env, timeout=600)
    assert all(f"compare: {arm}: reusing outputs/compare/seed{s}/{arm}" in again.stdout
               for s in (0, 1) for arm in ("sft", "grpo", "sft_blind"))
    assert results["test"]["sft_minus_sft_blind"]["seeds"] == 2
    assert json.loads((out / "compare.json").read_text()) == results
