"""A tracking server killed and restarted in the middle of the train stage: the stage finishes with the model an
uninterrupted run makes, and the MLflow run holds every step's metrics exactly once."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time

import pytest
import yaml
from mlflow.tracking import MlflowClient
from mlflow_server import MlflowServer
from pipeline_helpers import VENV_BIN, copy_of

pytestmark = pytest.mark.slow


def first_train_metrics(uri: str, timeout_s: float) -> bool:
    """Wait until the train run on the server has logged something."""
    client = MlflowClient(uri)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            runs = client.search_runs(
                [e.experiment_id for e in client.search_experiments()],
                filter_string="tags.`vlmgym.stage` = 'train'")
            if any(run.data.metrics for run in runs):
                return True
        except Exception:  # the server is busy starting the run
            pass
        time.sleep(0.2)
    return False


def steps_by_metric(client: MlflowClient, run_id: str) -> dict[str, list[int]]:
    keys = client.get_run(run_id).data.metrics
    return {key: sorted(m.step for m in client.get_metric_history(run_id, key)) for key in keys
            if not key.startswith("system/")}


def test_a_server_killed_and_restarted_mid_train_loses_no_metric_and_changes_no_output(pipeline, tmp_path):
    root, env = copy_of(pipeline, tmp_path / "repo")
    shutil.rmtree(root / "checkpoints" / "train")  # train from the start, as the fixture's run did
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["tracking"]["flush_timeout_s"] = 300  # the restart below must land before the stage gives up waiting
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    server = MlflowServer(tmp_path)
    server.start()
    try:
        train = subprocess.Popen([str(VENV_BIN / "python"), "stages/train.py"], cwd=root,
                                 env={**env, "MLFLOW_TRACKING_URI": server.uri}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        assert first_train_metrics(server.uri, timeout_s=600), "the train run never logged"
        server.kill()
        time.sleep(3)
        server.start()
        out, err = train.communicate(timeout=1200)
        assert train.returncode == 0, err[-6000:]
        assert "failed to take the run's logs" in err and "nothing was lost" in err, err[-4000:]
        for path, digest in pipeline["digests"].items():
            if path.startswith("models/jax/grpo/") or path == "metrics/train.json":
                assert (root / path).exists(), path
                assert hashlib.md5((root / path).read_bytes()).hexdigest() == digest, path
        served = MlflowClient(server.uri)
        [run] = served.search_runs([e.experiment_id for e in served.search_experiments()],
                                   filter_string="tags.`vlmgym.stage` = 'train'")
        assert run.info.status == "FINISHED"
        local = MlflowClient(f"sqlite:///{pipeline['root'] / 'mlflow.db'}")
        reference = next(r for r in local.search_runs([e.experiment_id for e in local.search_experiments()],
                                                      filter_string="tags.`vlmgym.stage` = 'train'")
                         if r.data.metrics)
        steps = steps_by_metric(served, run.info.run_id)
        assert steps == steps_by_metric(local, reference.info.run_id)  # every metric, each step once
        assert steps["reward_mean"] == [1, 2]
        assert served.get_run(run.info.run_id).data.metrics["reward_mean"] == reference.data.metrics["reward_mean"]
    finally:
        server.kill()
