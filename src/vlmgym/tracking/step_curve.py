"""A training stage's per-step figures as a DVC output: `metrics/curves/<stage>.jsonl`.

One JSON object per line, `{"step": int, "metrics": {name: float}}`, sorted by step, each step once: the figures
the trainer hands its metrics callback (and MLflow gets), under the same names (finite numbers only,
vlmgym.tracking.stage_runs.finite_metrics), less those that measure the process rather than the training
(PROCESS_METRICS: times, throughput, compile counts, which differ between two runs of the same training). The
evaluate stage draws its training curves from the train stage's file (vlmgym.eval.curve), so its report depends
on DVC-tracked files only.

A killed training resumes from its last checkpoint, so the steps before it are not run again. Each step's figures
are therefore appended to a journal in the run's checkpoint folder (`curve.jsonl`, flushed and synced before the
step's checkpoint is saved; a torn last line, the write a kill cut short, is dropped), and the stage writes its
output from the journal once training is done, keeping the last entry of each step: a resumed run recomputes the
steps after its checkpoint with the same figures, so a killed-and-resumed run writes the same bytes as an
uninterrupted one.

The format's reader (read_curve, curve_file) lives in vlmgym.tracking.pipeline_run, which copies each training
stage's curve onto the pipeline's parent run; it is importable from here too.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vlmgym.runtime.atomic import write_text_atomically
from vlmgym.tracking.pipeline_run import CURVES_DIR as CURVES_DIR
from vlmgym.tracking.pipeline_run import Curve as Curve
from vlmgym.tracking.pipeline_run import curve_entry
from vlmgym.tracking.pipeline_run import curve_file as curve_file
from vlmgym.tracking.pipeline_run import read_curve as read_curve
from vlmgym.tracking.stage_runs import finite_metrics

# The journal's name in the run's checkpoint folder.
JOURNAL = "curve.jsonl"
# Per-step figures of the process, not of the training: vlmgym.rl.loop.TIMING_METRICS (not imported, so that the
# evaluate stage reads curves without the training loop; tests/tracking/test_step_curve.py keeps this a superset) and
# the rollout engine's trace count, which restarts with each process.
PROCESS_METRICS = frozenset({"step_time_s", "rollout_time_s", "update_time_s", "data_wait_s", "tokens_per_s",
                             "sample_tokens_per_s", "compile_count", "rollout_compile_count"})

def curve_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """What a curve keeps of one step's figures: the finite numbers under MLflow's names, less PROCESS_METRICS."""
    return {name: value for name, value in finite_metrics(metrics).items() if name not in PROCESS_METRICS}


def _line(step: int, metrics: Mapping[str, float]) -> str:
    return json.dumps({"step": int(step), "metrics": {name: metrics[name] for name in sorted(metrics)}}) + "\n"


def read_journal(path: str | Path) -> Curve:
    """{step: figures} of a journal, the last entry of each step; a torn last line (no newline) is left out, and
    a journal that does not exist is empty."""
    path = Path(path)
    if not path.exists():
        return {}
    complete, _, _torn = path.read_bytes().rpartition(b"\n")
    curve: Curve = {}
    for number, line in enumerate(complete.decode("utf-8").split("\n") if complete else [], start=1):
        step, metrics = curve_entry(line, f"{path}:{number}")
        curve[step] = metrics
    return curve


class StepJournal:
    """Appends each step's figures to `<checkpoint folder>/curve.jsonl` (module docstring)."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / JOURNAL
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_torn_tail()

    def _drop_torn_tail(self) -> None:
        """Cut a last line a killed writer left without its newline, so the next entry starts a line of its own."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            os.truncate(self.path, keep)
            print(f"vlmgym: {self.path}: dropped a torn last line ({len(data) - keep} bytes) a killed run left",
                  file=sys.stderr, flush=True)

    def record(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append step `step`'s figures (curve_metrics; nothing when none is left), flushed and synced to disk."""
        kept = curve_metrics(metrics)
        if not kept:
            return
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(_line(step, kept))
            handle.flush()
            os.fsync(handle.fileno())

    def callback(self, then: Callable[[int, Mapping[str, Any]], None] | None = None) -> JournalCallback:
        """A trainer's metrics callback that records each step here, then calls `then` (e.g. the MLflow log)."""
        return JournalCallback(self, then)

    def entries(self) -> Curve:
        """{step: figures} recorded so far by this run and the runs it resumed."""
        return read_journal(self.path)


class JournalCallback:
    """A metrics callback that records each step in a StepJournal and then hands it on (`then`: e.g. the MLflow
    log). A resumed trainer calls `replay_through` with the step it resumed at, and the figures of the steps before
    it go from the journal to `then`: a forced rerun over a finished checkpoint (`dvc repro -f`), which trains no
    step, still logs every step to its new MLflow run (a continued run skips the steps it holds already)."""

    def __init__(self, journal: StepJournal, then: Callable[[int, Mapping[str, Any]], None] | None = None):
        self.journal, self.then = journal, then

    def __call__(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.journal.record(step, metrics)
        if self.then is not None:
            self.then(step, metrics)

    def replay_through(self, step: int) -> int:
        """Hand the journal's figures of every step up to `step` to `then` (not to the journal again), in step
        order; how many steps went."""
        if self.then is None:
            return 0
        restored = {k: v for k, v in self.journal.entries().items() if k <= step}
        for k in sorted(restored):
            self.then(k, restored[k])
        return len(restored)


def write_curve(path: str | Path, curve: Mapping[int, Mapping[str, float]]) -> Path:
    """Write `curve` as a curve file (one line per step, by step; empty without steps), atomically."""
    write_text_atomically(path, "".join(_line(step, curve[step]) for step in sorted(curve)))
    return Path(path)
