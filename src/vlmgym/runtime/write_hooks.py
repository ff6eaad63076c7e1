"""Callbacks at the moments a write commits. A stage's MLflow run holds its writes here until the run exists
(vlmgym.tracking.stage_runs.StageRun.wait_for_run); the kill-in-write test hook (`vlmgym.runtime.killpoint`)
registers itself here once, when the process starts with VLMGYM_KILL_IN_WRITE set."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

# Called with an atomic write's target (absolute) when its temp is complete and not yet renamed.
before_rename: list[Callable[[Path], None]] = []
# Called with (checkpoint folder, step, glob of the saver's temp folders) as a checkpoint save starts.
at_checkpoint_save: list[Callable[[Path, int, str], None]] = []
