"""An env from outside the package runs the whole pipeline: docs/writing-an-env.md's colour plug-in through `dvc repro`.

A fresh checkout with the micro preset, tests/envs/colour_env.py copied beside params.yaml (the working
directory is on the import path for 'module:Class' names), `env.name: colour_env:ColourEnv`, a three-step
perception warm-up on its colour labels, one `dvc repro`.
No file under src/ is touched: the env's data, reward, metrics and report section all come from the module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from pipeline_helpers import REPO, STAGES, micro_checkout, run_checked, stages_run
from shared_setup import shared_across_workers


@pytest.fixture(scope="module")
def colour_pipeline(tmp_path_factory):
    built = shared_across_workers(tmp_path_factory, "colour-pipeline", _build)  # one run, whichever worker asks
    return Path(built["root"]), built["env"], built["output"]


def _build(root):
    env = micro_checkout(root)
    shutil.copy(REPO / "tests" / "envs" / "colour_env.py", root / "colour_env.py")
    overlay = root / "colour.yaml"
    overlay.write_text(yaml.safe_dump({"env": {"name": "colour_env:ColourEnv", "colour": {"format_weight": 0.2}},
                                       "data": {"colour": {"noise": 10.0}}, "eval": {"hf_samples": 2},
                                       "sft": {"perception": {"steps": 3, "batch_size": 4,
                                                              "optimizer": {"warmup_steps": 1}}}}))
    # in the checkout: its working directory is where 'colour_env' imports from (as for the stages)
    run_checked(["vlmgym", "preset", overlay.name, "--on-top"], root, env)
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "colour env"], root, env)
    return {"root": str(root), "env": env, "output": run_checked(["dvc", "repro"], root, env).stdout}


def test_every_stage_ran_on_the_plug_in(colour_pipeline):
    root, env, output = colour_pipeline
    assert stages_run(output) == STAGES
    # the env's own params section is validated like any other
    checked = run_checked(["vlmgym", "params", "params.yaml"], root, env).stdout
    assert json.loads(checked)["env"]["colour"] == {"format_weight": 0.2}
    manifest = json.loads((root / "data" / "shards" / "manifest.json").read_text())
    assert manifest["dataset"] == "colour" and manifest["splits"]["test"]["kept"] == 16
    # docs/writing-an-env.md's layout: per split, the samples kept and the rows skipped, counted by reason
    for split in ("train", "val", "test"):
        assert manifest["splits"][split]["skipped"] == {} and manifest["splits"][split]["examples"] == {}


def test_the_sft_stage_warmed_the_tower_on_the_plug_in_labels(colour_pipeline):
    root, _, output = colour_pipeline
    summary = json.loads((root / "metrics" / "sft.json").read_text())
    assert 0 <= summary["perception/val_all_labels"] <= summary["perception/val_label_accuracy"] <= 1
    assert summary["perception/loss"] > 0
    warmed = list((root / "checkpoints" / "sft").glob("*/perception/perception.json"))
    assert len(warmed) == 1 and json.loads(warmed[0].read_text()) == {k: v for k, v in summary.items()
                                                                      if k.startswith("perception/")}


def test_metrics_and_report_come_from_the_plug_in(colour_pipeline):
    root, _, _ = colour_pipeline
    metrics = json.loads((root / "metrics" / "eval.json").read_text())
    for policy in ("base", "sft", "grpo"):
        assert metrics[policy]["n"] == 16
        assert 0 <= metrics[policy]["accuracy_ci_low"] <= metrics[policy]["accuracy"] <= 1
        assert "geoscore" not in metrics[policy]
    assert "accuracy" in metrics["grpo_minus_sft"]
    assert metrics["hf_baseline"]["greedy_token_agreement"] == 1.0
    page = (root / "reports" / "eval.html").read_text()
    assert "Environment <b>colour</b>" in page and "<h2>Colour confusions</h2>" in page
    assert "right colour" in page or "wrong colour" in page
    assert "| accuracy |" in (root / "reports" / "eval.md").read_text()
    records = [json.loads(line) for line in (root / "outputs" / "rollouts" / "sft.jsonl").read_text().splitlines()]
    assert records[0]["env"] == "colour" and set(records[0]["truth"]) == {"colour"}
    assert set(records[0]["reward_components"]) == {"correct", "format"}


def test_the_package_is_untouched(colour_pipeline):
    # the plug-in is the only addition to the checkout: src/ and stages/ are exactly as committed
    root, env, _ = colour_pipeline
    changed = run_checked(["git", "status", "--porcelain", "--", "src", "stages"], root, env).stdout
    assert changed == ""
    assert (root / "colour_env.py").is_file() and not (root / "src" / "vlmgym" / "envs" / "colour_env.py").exists()
