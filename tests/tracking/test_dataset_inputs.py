"""A stage's data dependencies logged as MLflow dataset inputs (vlmgym.tracking.stage_runs.log_inputs): local
sources, DVC's hash as the digest, and none of MLflow's "dataset source can be interpreted in multiple ways"
warnings that every stage printed."""

from __future__ import annotations

import json
import warnings

import mlflow
from mlflow.tracking import MlflowClient

from vlmgym.tracking.stage_runs import log_inputs


def test_data_dependencies_are_logged_as_local_datasets_without_a_warning(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Both where mlflow.set_tracking_uri would put it, each put back after the test: a later test in this process
    # that sets only the variable must not log into this database.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", uri)
    (tmp_path / "data" / "shards").mkdir(parents=True)
    tags = {"dvc.dep.data/shards": "0123abcd.dir", "dvc.dep.src/vlmgym/rl": "not data: not an input"}
    experiment = mlflow.create_experiment("inputs", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment) as run, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log_inputs(tags, tmp_path, "sft", MlflowClient(uri), run.info.run_id)
    assert [str(w.message) for w in caught if "dataset source" in str(w.message)] == []
    [logged] = MlflowClient(uri).get_run(run.info.run_id).inputs.dataset_inputs
    assert logged.dataset.name == "data/shards" and logged.dataset.digest == "0123abcd.dir"
    assert logged.dataset.source_type == "local"
    assert json.loads(logged.dataset.source) == {"uri": (tmp_path / "data" / "shards").resolve().as_uri()}
    assert [(t.key, t.value) for t in logged.tags] == [("mlflow.data.context", "sft")]
