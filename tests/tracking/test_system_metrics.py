"""System metrics go through the run's spool, as MLflow names them, with steps that a continued run carries on."""

import os
import subprocess
import sys
import time

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from vlmgym.tracking import system_metrics

TRAIN_STAGE = """
import time
from vlmgym.tracking.stage_runs import stage_run
with stage_run("train") as run:
    run.run_id  # the run opens in the background; its system metrics are sampled from then on
    time.sleep(1.5)
"""


def test_samples_are_queued_with_consecutive_steps_from_the_first():
    got = []
    sampler = system_metrics.SystemMetrics(lambda figures, step: got.append((step, figures)), first_step=7,
                                           interval_s=0.1)
    try:
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sampler.stop()
    assert [step for step, _ in got[:3]] == [7, 8, 9]
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= set(got[0][1])


def test_a_continued_run_goes_on_after_its_last_system_step(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("unit")).info.run_id
    assert system_metrics.next_step(client.get_run(run_id)) == 0
    client.log_batch(run_id, metrics=[Metric("system/cpu_utilization_percentage", 5.0, 1, 4),
                                      Metric("loss", 1.0, 1, 40)])
    assert system_metrics.next_step(client.get_run(run_id)) == 5


def test_the_train_stage_run_holds_system_metrics(tmp_path):
    (tmp_path / "params.yaml").write_text("tracking:\n  experiment: unit\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2"}
    done = subprocess.run([sys.executable, "-c", TRAIN_STAGE], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("unit").experiment_id])
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")]
    assert len(steps) >= 2 and steps == list(range(len(steps)))
