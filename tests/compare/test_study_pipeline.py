"""A study end to end on a fresh micro checkout: `vlmgym study new` with 2 seeds x [grpo, sft_longer, sft_compute], `dvc
repro` of its dvc.yaml (which first runs the pipeline stages it needs: data, base model), the report's paired
differences with their t-intervals and every seed's row, greedy beside sampled mean and best-of-k reward, the stage
runs nested under the study's MLflow parent; a second repro runs nothing, and a changed arm setting reruns that arm's
stages and the report alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))  # the micro checkout's helpers
from pipeline_helpers import micro_checkout, run_checked, stages_run  # noqa: E402

from vlmgym.stats.seed_interval import seed_t_interval  # noqa: E402

pytestmark = pytest.mark.slow
STUDY = "studies/rl-vs-sft"
ARMS = ["grpo", "sft_longer", "sft_compute"]
TRAINED = ["start@5", "start@6", *[f"arm@{seed}-{arm}" for seed in (5, 6) for arm in ARMS]]


def test_a_study_runs_as_a_dvc_pipeline_reports_over_seeds_and_reruns_only_what_changed(tmp_path):
    from mlflow.tracking import MlflowClient

    root = tmp_path / "repo"
    root.mkdir()
    env = micro_checkout(root)
    run_checked(["vlmgym", "study", "new", "rl-vs-sft", "--seeds", "5", "6", "--arms", *ARMS], root, env)
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "study rl-vs-sft: settings"], root, env)  # pre-registered
    first = stages_run(run_checked(["dvc", "repro", f"{STUDY}/dvc.yaml"], root, env).stdout)
    assert sorted(first[:4]) == ["base_model", "convert", "download", "shard"]  # the pipeline stages the study needs
    # DVC orders stages that do not depend on each other by Python's hash seed: every one once, the report last
    assert sorted(first[4:]) == sorted(f"{STUDY}/dvc.yaml:{s}" for s in [*TRAINED, "blind@5", "blind@6", "constant",
                                                                        "report"])
    assert first[-1] == f"{STUDY}/dvc.yaml:report"
    for seed in (5, 6):  # each arm after its seed's start
        start = first.index(f"{STUDY}/dvc.yaml:start@{seed}")
        assert all(start < first.index(f"{STUDY}/dvc.yaml:arm@{seed}-{arm}") for arm in ARMS), first

    report = json.loads((root / STUDY / "report.json").read_text())
    assert report["seeds"] == [5, 6] and report["interval"] == "t over seeds"
    assert list(report["results"]) == ["test", "test_ood"]
    for split, results in report["results"].items():
        for name in ("grpo_minus_sft", "sft_longer_minus_sft", "grpo_minus_sft_longer", "grpo_minus_sft_compute"):
            flat = results[name]
            assert flat["seeds"] == 2 and flat["n"] == {"test": 16, "test_ood": 8}[split]
            t = seed_t_interval([flat["mean_reward_seed0"], flat["mean_reward_seed1"]], report["confidence"])
            assert [flat["mean_reward_ci_low"], flat["mean_reward_ci_high"]] == pytest.approx([t.low, t.high])
            assert flat["mean_reward_boot_low"] <= flat["mean_reward"] <= flat["mean_reward_boot_high"]
    text = (root / STUDY / "report.md").read_text()
    assert "| difference | split | mean | 95% t-interval (seeds) | 95% two-level bootstrap | seeds |" in text
    for row in ("| grpo - sft | test |", "| sft_longer - sft | test_ood |", "| grpo - sft_longer | test |",
                "| grpo - sft_compute | test |", "| best-of-k reward, k sampled |", "| mean reward, k sampled |"):
        assert row in text
    # the test split sampled k = 4 answers per prompt for the start and every arm; the held-out OOD split greedily
    for name in ("sft", *ARMS):
        for split in ("test", "test_ood"):
            assert ("best_of_k_reward" in report["results"][split][name]) == (split == "test")
        flat = report["results"]["test"][name]
        assert flat["best_of_k_reward"] >= flat["sampled_mean_reward"]
        assert len((root / STUDY / f"runs/5/{name}/test.sampled.jsonl").read_text().splitlines()) == 16 * 4
    compute_steps = report["training"]["sft_compute"]["5"]["steps"]
    assert f"sft_compute {compute_steps:.0f} more SFT steps" in text
    assert text.count("| policy | seed 5 | seed 6 | mean |") == 2 and "| grpo - sft_longer | " in text
    assert (root / STUDY / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for seed in (5, 6):
        assert (root / STUDY / f"runs/{seed}/grpo/model/vlmgym_checkpoint.json").is_file()
        assert len((root / STUDY / f"runs/{seed}/sft_longer/test_ood.jsonl").read_text().splitlines()) == 8

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("vlmgym").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("vlmgym.role") == "study"]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == sorted([*TRAINED, "blind@5", "blind@6", "constant", "report"])
    assert children["arm@6-grpo"].data.tags["vlmgym.arm"] == "grpo"
    assert "loss" in children["arm@5-sft_longer"].data.metrics
    assert parent.data.metrics["test/grpo_minus_sft/mean_reward"] == pytest.approx(
        report["results"]["test"]["grpo_minus_sft"]["mean_reward"])

    again = run_checked(["dvc", "repro", f"{STUDY}/dvc.yaml"], root, env).stdout
    assert stages_run(again) == [] and "Data and pipelines are up to date." in again

    params = root / STUDY / "params.yaml"
    settings = yaml.safe_load(params.read_text())
    settings["arm"]["grpo"] = {"optimizer": {"lr": 0.0003}}
    params.write_text(yaml.safe_dump(settings))
    changed = stages_run(run_checked(["dvc", "repro", f"{STUDY}/dvc.yaml"], root, env).stdout)
    assert sorted(changed) == [f"{STUDY}/dvc.yaml:{s}" for s in ("arm@5-grpo", "arm@6-grpo", "report")]
    assert changed[-1] == f"{STUDY}/dvc.yaml:report"
    assert "`grpo`: {\"optimizer\": {\"lr\": 0.0003}}" in (root / STUDY / "report.md").read_text()


def test_a_study_of_another_env_builds_its_own_data_and_base_model_and_leaves_the_pipeline_alone(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    env = micro_checkout(root)  # the repository's pipeline trains geospot
    run_checked(["vlmgym", "study", "new", "pairs", "--env", "nlvr2", "--seeds", "5", "--arms", "grpo"], root, env)
    # nlvr2's recipe trains for minutes: the micro preset over it, as a user shrinks a study to try it
    run_checked(["vlmgym", "preset", "configs/micro.yaml", "--on-top", "--params", "studies/pairs/pipeline.yaml"],
                root, env)
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "study pairs: settings"], root, env)
    ran = stages_run(run_checked(["dvc", "repro", "studies/pairs/dvc.yaml"], root, env).stdout)
    head, study = ["download", "shard", "base_model", "convert"], ["start@5", "arm@5-grpo", "blind@5", "constant"]
    assert sorted(ran) == sorted(f"studies/pairs/dvc.yaml:{s}" for s in [*head, *study, "report"])
    assert {s.split(":")[1] for s in ran[:4]} == set(head)  # its data and base model first
    assert (root / "studies/pairs/data/shards/test").is_dir() and (root / "studies/pairs/models/jax/base").is_dir()
    assert not (root / "data/shards").exists() and not (root / "models").exists()  # the pipeline's own: not built
    report = json.loads((root / "studies/pairs/report.json").read_text())
    assert report["env"] == "nlvr2" and report["seeds"] == [5]
    records = (root / "studies/pairs/runs/5/grpo/test.jsonl").read_text().splitlines()
    assert records and json.loads(records[0])["answer"] is not None
    assert "Data and pipelines are up to date." in run_checked(["dvc", "repro", "studies/pairs/dvc.yaml"], root,
                                                               env).stdout
