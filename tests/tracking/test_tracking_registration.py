"""The model registry through the spool: a tracking server that dies while the export stage registers its folder
leaves the registration pending, never lost; `vlmgym tracking sync` registers the version once the server is back
(the upload the outage cut short, left PENDING, marked FAILED) and then decides the champion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from vlmgym.tracking import model_registry as registry
from vlmgym.tracking import spool as spool_mod
from vlmgym.tracking import stage_runs as tracking

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent

# The export stage's registration, with the server killed once MLflow has created the logged model (PENDING) and
# before it has uploaded it.
EXPORT_STAGE = """
import os, signal, sys, time
from mlflow.tracking import MlflowClient
from vlmgym.tracking.stage_runs import stage_run

server_pid, folder = int(sys.argv[1]), sys.argv[2]
with stage_run("export") as run:
    run.register_model(folder, "geospot", max_new_tokens=4)
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not [
            m for m in client.search_logged_models([run.run.info.experiment_id]) if "PENDING" in str(m.status)]:
        time.sleep(0.02)
    os.killpg(server_pid, signal.SIGKILL)
    print(f"registered in the stage: {run.wait_sent()}")
print("export: the folder is written")
"""


def logged_models(client: MlflowClient, run_id: str) -> list[str]:
    experiment = client.get_run(run_id).info.experiment_id
    return sorted(str(m.status).rsplit(".", 1)[-1]
                  for m in client.search_logged_models([experiment], filter_string=f"source_run_id = '{run_id}'"))


@pytest.fixture
def exported(tmp_path):
    """A tiny transformers folder, as the export stage writes one."""
    from vlmgym.models.qwen3_vl.base_model import TinyDims, build_tiny
    from vlmgym.tracking import pyfunc_model

    folder = tmp_path / "models" / "hf" / "grpo"
    build_tiny(folder, [pyfunc_model.EXAMPLE_PROMPT, "Country: France"], seed=0,
               dims=TinyDims.scaled(hidden_size=64, num_layers=2), vocab_size=400)
    return folder


def test_a_registration_the_server_dies_during_waits_in_the_spool_and_sync_completes_it(tmp_path, exported):
    from mlflow_server import MlflowServer

    server = MlflowServer(tmp_path / "server")
    (tmp_path / "server").mkdir()
    server.start()
    (tmp_path / "params.yaml").write_text("tracking:\n  experiment: outage\n  flush_timeout_s: 3\n"
                                          "  system_metrics: false\n")
    env = {**os.environ, "MLFLOW_TRACKING_URI": server.uri, "PATH": f"{BIN}:{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    env.pop(tracking.PIPELINE_ID_ENV, None)
    try:
        done = subprocess.run([sys.executable, "-c", EXPORT_STAGE, str(server.process.pid), str(exported)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        assert "registered in the stage: False" in done.stdout and "the folder is written" in done.stdout
        assert "vlmgym tracking sync" in done.stderr and "Traceback" not in done.stderr, done.stderr[-4000:]
        [spooled] = (tmp_path / "mlflow-spool").iterdir()
        entries = [json.loads(line) for line in (spooled / spool_mod.JOURNAL).read_text().splitlines()]
        [register] = [e for e in entries if e["kind"] == "register"]
        assert register["path"] == str(exported) and register["lineage"]["dvc.hash"] == tracking.dvc_hash(exported)

        server.start()
        client = MlflowClient(server.uri)
        assert logged_models(client, spooled.name) == ["PENDING"]  # the upload the outage cut short
        assert not client.search_registered_models()
        # The evaluate stage's decision, queued after the export (its spool would sort first by name).
        evaluate = spool_mod.Spool(tmp_path / "mlflow-spool" / "0-evaluate")
        evaluate.set_uri(server.uri)
        evaluate.append({"kind": "promote", "run_id": "evaluate-run", "env_name": "geospot",
                         "model_hash": register["lineage"]["dvc.hash"], "value": 0.5, "figure": "mean_reward"})

        synced = subprocess.run([str(BIN / "vlmgym"), "tracking", "sync"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=600)
        assert synced.returncode == 0, synced.stderr[-4000:] + synced.stdout
        assert "export: registered vlmgym-geospot version 1" in synced.stdout
        assert "vlmgym-geospot version 1 (mean_reward 0.5000) is the first champion" in synced.stdout
        version = client.get_model_version("vlmgym-geospot", "1")
        assert version.run_id == spooled.name and version.tags["vlmgym.run_id"] == spooled.name
        assert version.tags["dvc.hash"] == register["lineage"]["dvc.hash"]
        assert logged_models(client, spooled.name) == ["FAILED", "READY"]
        assert client.get_model_version_by_alias("vlmgym-geospot", registry.CHAMPION).version in ("1", 1)
        assert not list((tmp_path / "mlflow-spool").iterdir())

        # Sent again (an answer lost after the server made the version), the registration finds it.
        assert registry.register_entry(client, register).version in ("1", 1)
        assert len(client.search_model_versions("name = 'vlmgym-geospot'")) == 1
    finally:
        server.kill()


def test_a_folder_changed_or_gone_since_the_export_is_not_registered(tmp_path, exported):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    entry = {"kind": "register", "run_id": run_id,
             **registry.registration(exported, "geospot", 4, {"dvc.hash": "h", "vlmgym.run_id": run_id})}
    (exported / "config.json").write_text((exported / "config.json").read_text() + " ")
    with pytest.raises(ValueError, match="changed since the export run"):
        registry.register_entry(client, entry)
    entry["path"] = str(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="run the export stage again"):
        registry.register_entry(client, entry)
