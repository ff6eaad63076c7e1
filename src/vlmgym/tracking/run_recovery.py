"""MLflow runs of killed stages: closed as KILLED once their process is gone, and continued when training resumes.

A stage run is tagged `vlmgym.writer` = `{host}-{pid}` (as temp names are, `vlmgym.runtime.temps`). When any stage
starts, the experiment's RUNNING runs whose process no longer runs on this host are set to KILLED. A training
stage that resumes from a checkpoint continues the MLflow run that wrote it: the run id is kept in
`mlflow_run.json` in the checkpoint folder, and the continued run skips the steps it already logged (training
is deterministic given its checkpoint, so the recomputed values are the ones already there), so every step is
in the run once.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmgym.runtime import temps
from vlmgym.runtime.atomic import write_text_atomically

WRITER_TAG = "vlmgym.writer"
RESUMED_TAG = "vlmgym.resumed_times"
RUN_FILE = "mlflow_run.json"


def close_dead_runs(client: Any, experiment_id: str) -> list[str]:
    """Set RUNNING runs of the experiment whose writer process is dead (this host only) to KILLED; their ids."""
    closed = []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'",
                                  max_results=1000):
        writer = run.data.tags.get(WRITER_TAG, "")
        host, _, pid = writer.rpartition("-")
        if not (host and pid.isdigit()):
            continue
        if temps.process_state(host, int(pid), since=run.info.start_time / 1000) == "dead":
            client.set_terminated(run.info.run_id, status="KILLED")
            closed.append(run.info.run_id)
            print(f"vlmgym: MLflow run {run.info.run_id} ({run.data.tags.get('vlmgym.stage', '?')}) was left "
                  f"RUNNING by {writer}, which no longer runs: marked KILLED", file=sys.stderr, flush=True)
    return closed


@dataclass
class Continued:
    """A run to continue, the last step it logged (-1: none) and how often it was continued before."""

    run_id: str
    logged_through: int
    resumed_times: int


def run_to_continue(folder: str | Path, client: Any, tracking_uri: str) -> Continued | None:
    """The unfinished run recorded in `folder` (a training stage's checkpoint folder) in this tracking store."""
    path = Path(folder) / RUN_FILE
    try:
        record = json.loads(path.read_text())
        run = client.get_run(record["run_id"])
    except (OSError, ValueError, KeyError):
        return None
    except Exception as err:  # MLflow's "not found" (another store, or the run was deleted)
        print(f"vlmgym: {path} names run {record.get('run_id')!r}, not in {tracking_uri} ({type(err).__name__}): "
              "starting a new run", file=sys.stderr)
        return None
    if record.get("tracking_uri") != tracking_uri or run.info.status == "FINISHED" or \
            run.info.lifecycle_stage != "active":
        return None
    logged = [m.step for key in run.data.metrics for m in client.get_metric_history(run.info.run_id, key)]
    return Continued(run.info.run_id, max(logged, default=-1), int(run.data.tags.get(RESUMED_TAG, "0")))


def remember_run(folder: str | Path, run_id: str, tracking_uri: str) -> None:
    """Record the run that trains into `folder`, so that a resumed training continues it."""
    write_text_atomically(Path(folder) / RUN_FILE,
                          json.dumps({"run_id": run_id, "tracking_uri": tracking_uri}, indent=2) + "\n")
