"""The pipeline's DVC metrics are the headline alone, so `dvc metrics show` and `dvc exp show` open on a row that
fits a terminal (tests/eval/test_headline.py measures that row's width); every other figure file is a plain output."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_the_headline_is_the_pipelines_only_metrics_file():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    metrics = [next(iter(entry)) if isinstance(entry, dict) else entry
               for stage in stages.values() for entry in stage.get("metrics", [])]
    assert metrics == ["metrics/headline.json"]
    outs = {next(iter(entry)) if isinstance(entry, dict) else entry for stage in stages.values()
            for entry in stage.get("outs", [])}
    assert {"metrics/eval.json", "metrics/sft.json", "metrics/train.json"} <= outs  # still written, and tracked
