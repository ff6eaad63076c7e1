"""A forgetting study end to end on a fresh micro checkout: `vlmgym study new --new-skill` over two envs (one
question of digits held out of the generalist as the new skill), `dvc repro` of its dvc.yaml (its own data and base
model first), a report with both methods' curves, the change on every old skill and split, a KL per run that is
exactly 0 for the generalist against itself and >= 0 within its sampling error for every point; a second repro
runs nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))  # the micro checkout's helpers
from pipeline_helpers import micro_checkout, run_checked, stages_run  # noqa: E402

pytestmark = pytest.mark.slow
STUDY = "studies/forget"
OLD = {"digits": ["test", "test_ood"], "geospot": ["test", "test_ood"]}  # both generators write an OOD split
POINTS = ["sft_2", "grpo_2"]
# the old skills: digits' sort question and geospot; the new skill: digits' sum question, which the generalist never
# sees (its one-digit images' sort answer is their sum, so it can sample right answers)
WARM_UP = {"steps": 3, "batch_size": 4, "eval_every": 0}
OVERLAY = {"env": {"mixture": {"envs": {"digits": 1.0, "geospot": 1.0}}, "digits": {"tasks": ["sort"]}}}


def test_a_forgetting_study_runs_as_a_dvc_pipeline_and_reports_both_curves_and_the_kl(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    env = micro_checkout(root)
    run_checked(["vlmgym", "study", "new", "forget", "--env", "mixture", "--new-skill", "digits",
                 "--new-skill-setting", "tasks=[sum]", "--seeds", "5", "6", "--sft-steps", "2", "--rl-steps", "2"],
                root, env)
    (root / "overlay.yaml").write_text(yaml.safe_dump(OVERLAY))
    for preset in ("configs/micro.yaml", "overlay.yaml"):  # the study's pipeline at micro scale, over the two envs
        run_checked(["vlmgym", "preset", preset, "--on-top", "--params", f"{STUDY}/pipeline.yaml"], root, env)
    settings = yaml.safe_load((root / STUDY / "params.yaml").read_text())
    assert settings["study"]["points"] == POINTS and settings["new_skill"] == {"env": "digits",
                                                                               "settings": {"tasks": ["sum"]}}
    # the generalist's tower warms up on the labels of the one old skill that has them (digits)
    settings["generalist"]["perception"] = WARM_UP
    (root / STUDY / "params.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "study forget: settings"], root, env)  # pre-registered

    ran = stages_run(run_checked(["dvc", "repro", f"{STUDY}/dvc.yaml"], root, env).stdout)
    trained = [*(f"{stage}@{seed}" for stage in ("generalist", "single") for seed in (5, 6)),
               *(f"point@{seed}-{point}" for seed in (5, 6) for point in POINTS)]
    head = ["download", "shard", "base_model", "convert"]
    assert sorted(ran) == sorted(f"{STUDY}/dvc.yaml:{s}" for s in [*head, *trained, "constant", "report"])
    assert ran[-1] == f"{STUDY}/dvc.yaml:report"
    for seed in (5, 6):  # each point after its seed's generalist
        assert all(ran.index(f"{STUDY}/dvc.yaml:generalist@{seed}") < ran.index(f"{STUDY}/dvc.yaml:point@{seed}-{p}")
                   for p in POINTS)

    # warmed up: the generalist (on digits' images, inside the mixture) and digits' single-task reference; geospot's
    # reference, whose env has no labels, is not
    checkpoints = root / "checkpoints/studies/forget"  # <seed>/<run>/<config hash>/perception/perception.json
    warmed = {"/".join(path.relative_to(checkpoints).parts[:-3]) for path in checkpoints.rglob("perception.json")}
    assert warmed == {f"{seed}/{run}" for seed in (5, 6) for run in ("generalist", "single/digits")}

    report = json.loads((root / STUDY / "report.json").read_text())
    assert report["seeds"] == [5, 6] and report["old_skills"] == sorted(OLD) and report["new_skill"] == "digits"
    assert report["splits"] == ["test", "test_ood"]
    points = report["points"]
    assert {name: f["method"] for name, f in points.items()} == {"sft_2": "sft", "grpo_2": "grpo"}
    for f in points.values():  # every figure of every point: a mean over the two seeds with its t-interval
        for figure in (f["gain"], *f["change"].values(), *f["kl"].values()):
            assert len(figure["values"]) == 2 and figure["ci_low"] <= figure["mean"] <= figure["ci_high"]
        assert {part: sorted(by) for part, by in f["change_per_skill"].items()} == OLD
    # the generalist against itself: exactly 0, both ways; a point moved away: >= 0 within its sampling error
    assert report["generalist_kl"] == {"policy_to_generalist": [0.0, 0.0], "generalist_to_policy": [0.0, 0.0]}
    for seed in (5, 6):
        for point in POINTS:
            kl = json.loads((root / STUDY / f"runs/{seed}/{point}/kl.json").read_text())
            assert kl["prompts"] == len((root / STUDY / f"runs/{seed}/{point}/new/test.jsonl").read_text().splitlines())
            for direction in ("policy_to_generalist", "generalist_to_policy"):
                assert kl[direction] >= -3 * kl[f"{direction}_se"]
    generalist = report["generalist"]
    assert {part: sorted(by) for part, by in generalist["old"].items()} == OLD
    for by_split in generalist["old"].values():
        for f in by_split.values():
            assert {"generalist", "single", "blind", "generalist_minus_single", "generalist_minus_blind"} <= set(f)
    new = generalist["new"]
    assert new["k"] == 4 and new["best_of_k_reward"]["mean"] >= new["sampled_mean_reward"]["mean"]
    new_answers = (root / STUDY / "runs/5/generalist/new/test.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in new_answers]
    assert records and {r["truth"]["task"] for r in records} == {"sum"}  # the new skill asks the held-out question
    old = (root / STUDY / "runs/5/generalist/old/digits/test.jsonl").read_text().splitlines()
    assert old and {json.loads(line)["truth"]["task"] for line in old} == {"sort"}
    for split in ("test", "test_ood"):
        assert split in report["matched"] and split in report["kl_predicts_forgetting"]

    text = (root / STUDY / "report.md").read_text()
    for heading in ("## The generalist", "## Each sweep point", "## Old-skill change at matched new-skill gain",
                    "## Does the KL predict forgetting?"):
        assert heading in text
    assert "| sft_2 | sft |" in text and "| grpo_2 | grpo |" in text
    assert (root / STUDY / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    again = run_checked(["dvc", "repro", f"{STUDY}/dvc.yaml"], root, env).stdout
    assert stages_run(again) == [] and "Data and pipelines are up to date." in again
