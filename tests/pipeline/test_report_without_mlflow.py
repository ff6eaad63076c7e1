"""The evaluate stage's report depends on DVC-tracked files only: its training curves come from the train stage's
metrics/curves/train.jsonl (a dep), never from the MLflow store, so without the store it writes the same bytes."""

from __future__ import annotations

import shutil

import pytest
from pipeline_helpers import copy_of, output_digests, run_checked, stages_run

pytestmark = pytest.mark.slow

EVALUATE_OUTPUTS = ("reports/", "metrics/")


def _evaluate_outputs(digests: dict[str, str]) -> dict[str, str]:
    return {path: md5 for path, md5 in digests.items() if path.startswith(EVALUATE_OUTPUTS)}


def test_evaluate_without_the_mlflow_store_writes_the_same_report(pipeline, tmp_path):
    root, env = copy_of(pipeline, tmp_path / "checkout")
    (root / "mlflow.db").unlink()
    for artifacts in ("mlruns", "mlartifacts"):
        shutil.rmtree(root / artifacts, ignore_errors=True)
    result = run_checked(["dvc", "repro", "-f", "-s", "evaluate"], root, env)
    assert stages_run(result.stdout) == ["evaluate"]
    assert "no training reward curve" not in result.stdout + result.stderr
    # There is a curve to compare: the train steps, drawn from the train stage's curve file.
    assert (root / "metrics/curves/train.jsonl").read_text()
    assert (root / "metrics/plots/train_reward.csv").read_text().splitlines()[1:]
    expected = _evaluate_outputs(pipeline["digests"])
    assert any(path.startswith("reports/") for path in expected)
    assert _evaluate_outputs(output_digests(root)) == expected
