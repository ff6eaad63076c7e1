"""Killed stages in MLflow: their RUNNING run is closed as KILLED, and a resumed training continues its run
with every step logged once (real SIGKILLs of stage processes on a temp SQLite store)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow

TRAINING = textwrap.dedent(
    """
    import os, signal, sys
    from vlmgym.tracking.stage_runs import stage_run

    folder, kill_at = sys.argv[1], int(sys.argv[2])
    with stage_run("train", {"lr": 0.1}, experiment="unit", resume_folder=folder) as run:
        run.run_id  # the run opens in the background: it exists before the first step (a real step takes longer)
        for step in range(1, 7):
            run.log_metrics({"loss": 1.0 / step, "reward": step / 10}, step=step)
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        run.log_metrics({"final": 1.0})
    """
)


def _run(tmp_path, kill_at, folder="checkpoints/abc"):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "DVC_ROOT": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", TRAINING, str(tmp_path / folder), str(kill_at)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


def _runs(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("unit")
    return client, client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])


def test_a_killed_training_run_is_continued_with_every_step_once(tmp_path):
    killed = _run(tmp_path, kill_at=4)
    assert killed.returncode == -signal.SIGKILL
    client, [run] = _runs(tmp_path)
    assert run.info.status == "RUNNING"  # nothing could close it
    resumed = _run(tmp_path, kill_at=0)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"continuing MLflow run {run.info.run_id} (steps through 4 already logged)" in resumed.stderr
    client, [again] = _runs(tmp_path)
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert again.data.tags["vlmgym.resumed_times"] == "1"
    for key in ("loss", "reward"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2, 3, 4, 5, 6], key
    assert again.data.params == {"lr": "0.1"}
    # A finished run is never reopened: training into the same folder again is a new run.
    assert _run(tmp_path, kill_at=0).returncode == 0
    client, runs = _runs(tmp_path)
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"] and runs[1].info.run_id != run.info.run_id


def test_a_run_whose_process_died_is_closed_as_killed_when_a_stage_starts(tmp_path):
    assert _run(tmp_path, kill_at=2, folder="checkpoints/one").returncode == -signal.SIGKILL
    _, [orphan] = _runs(tmp_path)
    started = _run(tmp_path, kill_at=0, folder="checkpoints/two")  # another stage (folder): a new run
    assert started.returncode == 0, started.stderr[-2000:]
    assert f"MLflow run {orphan.info.run_id} (train) was left RUNNING by" in started.stderr
    client, runs = _runs(tmp_path)
    assert [r.info.status for r in runs] == ["KILLED", "FINISHED"]
    # A live stage's run is left alone: this process's own RUNNING run survives another stage's start.
    from vlmgym.runtime.atomic import writer_tag
    from vlmgym.tracking import run_recovery

    live = client.create_run(runs[0].info.experiment_id, tags={run_recovery.WRITER_TAG: writer_tag()})
    assert run_recovery.close_dead_runs(client, runs[0].info.experiment_id) == []
    assert client.get_run(live.info.run_id).info.status == "RUNNING"
