"""Processes started side by side on a fresh SQLite MLflow store all open the experiment (one is created)."""

import subprocess
import sys
import time

import mlflow
import pytest

pytestmark = pytest.mark.slow

WORKER = """
import sys, time
from pathlib import Path
import mlflow  # the slow import first, so that every process reaches the store at the same moment
from vlmgym.tracking.stage_runs import open_experiment
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.01)
print(open_experiment(sys.argv[1], "side-by-side"))
"""


def test_processes_opening_a_fresh_sqlite_store_at_once_all_get_the_one_experiment(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, uri, str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    time.sleep(8)  # every worker has imported mlflow and waits
    go.touch()
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in results]
    ids = {out.strip().splitlines()[-1] for out, _ in results}
    assert len(ids) == 1
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.get_experiment_by_name("side-by-side")
    assert experiment.experiment_id in ids
    assert experiment.artifact_location == (tmp_path / "store" / "mlartifacts").as_uri()
