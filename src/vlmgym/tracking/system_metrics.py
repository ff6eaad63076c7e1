"""System metrics (CPU, memory, disk, network, and GPU where present) of a stage run, sent through its spool.

MLflow's own monitor (`start_run(log_system_metrics=True)`) sends each sample straight to the server and stops
for good at the first call that fails, so a server restart would end the series. This one samples with MLflow's
collectors and queues each sample on the run's spool (vlmgym.tracking.spool) like any other metric, under MLflow's
names (`system/cpu_utilization_percentage`, ...), so the UI's system metrics tab shows it and an outage loses
nothing.
"""

from __future__ import annotations

import threading
from typing import Any

PREFIX = "system/"
DEFAULT_INTERVAL_S = 10.0  # MLflow's default sampling interval


def _monitors() -> list[Any]:
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    monitors = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    for gpu in ("gpu_monitor:GPUMonitor", "rocm_monitor:ROCMMonitor"):  # NVIDIA (pynvml), then AMD (pyrsmi)
        module, name = gpu.split(":")
        try:
            imported = __import__(f"mlflow.system_metrics.metrics.{module}", fromlist=[name])
            monitors.append(getattr(imported, name)())
            break
        except Exception:  # no such GPU, or its library is missing: CPU figures only
            continue
    return monitors


def next_step(run: Any) -> int:
    """The step after the last system sample a (continued) run holds; 0 for a new run."""
    steps = [m.step for m in getattr(run.data, "_metric_objs", []) if m.key.startswith(PREFIX)]
    return max(steps, default=-1) + 1


class SystemMetrics:
    """A daemon thread queueing one aggregated sample every interval_s via `queue(metrics, step)`."""

    def __init__(self, queue: Any, first_step: int = 0, interval_s: float | None = None):
        from mlflow.environment_variables import MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL

        self.queue, self.step = queue, first_step
        self.interval_s = interval_s or MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL.get() or DEFAULT_INTERVAL_S
        self.monitors = _monitors()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="vlmgym-system-metrics", daemon=True)
        self.thread.start()

    def sample(self) -> dict[str, float]:
        figures: dict[str, float] = {}
        for monitor in self.monitors:
            monitor.collect_metrics()
            figures.update({PREFIX + k: float(v) for k, v in monitor.aggregate_metrics().items()})
            monitor.clear_metrics()
        return figures

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                figures = self.sample()
            except Exception:  # a collector failing (a GPU gone away) must not end the run's logging
                continue
            if figures:
                self.queue(figures, self.step)
                self.step += 1

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
