"""One MLflow parent run per pipeline run, the stage runs nested under it.

A pipeline run is one `dvc repro` or one `dvc exp run` (a queued experiment runs in its own DVC process, so it
is one too): its id names the DVC process that runs the stages (`vlmgym.pipeline_id`). The first stage that
starts creates the parent run (tag `vlmgym.role` = `pipeline`) with every section of params.yaml as its params,
the DVC experiment name as its run name, the git state, and the DVC process as its writer (so a killed
`dvc repro` leaves no RUNNING parent: vlmgym.tracking.run_recovery closes it like a stage run). Each stage run points at
it with MLflow's `mlflow.parentRunId` tag, which is what `mlflow ui` nests by; the evaluate stage copies its
headline figures onto it (those of metrics/headline.json, under the evaluate run's names, e.g.
`grpo_minus_sft/mean_reward`; the evaluate run itself keeps every figure), so one row of the experiment table holds
one pipeline's params and results, few enough to read:

    mlflow.search_runs(experiment_names=["vlmgym"], filter_string="tags.`vlmgym.role` = 'pipeline'")

The parent's status follows its stages: RUNNING while one runs, FINISHED after one succeeds, FAILED after one
fails.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmgym.runtime import temps

PIPELINE_ID_ENV = "VLMGYM_PIPELINE_ID"
ROLE_TAG = "vlmgym.role"
PIPELINE_ROLE = "pipeline"
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag
STANDALONE = "standalone-"
_BATCH = 100  # MLflow's limit of params per log_batch call


def _process_ancestors(pid: int) -> Iterator[tuple[int, str, str]]:
    """(pid, cmdline, start time) of each ancestor, from the nearest up (Linux /proc)."""
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return
        # The command name in field 2 may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        yield pid, cmdline, fields[19]
        pid = int(fields[1])


def dvc_process() -> tuple[int, str] | None:
    """(pid, start time) of the nearest ancestor that is a dvc process, or None outside DVC."""
    for pid, cmdline, start in _process_ancestors(os.getppid()):
        words = cmdline.split()
        if any(Path(w).name == "dvc" or w.endswith("/dvc") for w in words[:2]) or "dvc.cli" in cmdline:
            return pid, start
    return None


def pipeline_id() -> str:
    """An id shared by all stage runs of one `dvc repro` / `dvc exp run`.

    VLMGYM_PIPELINE_ID overrides; otherwise the id of the dvc process that runs
    the stages (pid + start time, unique on this host); outside DVC a fresh id.
    """
    if os.environ.get(PIPELINE_ID_ENV):
        return os.environ[PIPELINE_ID_ENV]
    process = dvc_process()
    if process:
        return f"dvc-{os.uname().nodename}-{process[0]}-{process[1]}"
    return f"{STANDALONE}{uuid.uuid4().hex[:12]}"


def flat_params(value: Any, prefix: str = "") -> dict[str, str]:
    """Params (a mapping or a dataclass, nested) as MLflow params: dotted keys, lists as JSON, values cut to
    MLflow's 6000 characters."""
    import dataclasses
    import json

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        from vlmgym.params import to_dict

        value = to_dict(value)  # envs' own sections under their names, as in params.yaml
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flat_params(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    text = json.dumps(value) if isinstance(value, list | tuple) else str(value)
    return {prefix: text[:6000]}


@dataclass(frozen=True)
class Group:
    """A parent run that outlives one pipeline run (a study's, vlmgym.compare.study): found by its `key` tags (its role
    among them) whichever `dvc repro` runs its stages, created with `name`, the `key` tags and `params`."""

    key: Mapping[str, str]
    name: str
    params: Mapping[str, Any]


def parent_run(client: Any, experiment_id: str, pipeline: str, *, params: Mapping[str, Any],
               tags: Mapping[str, str], exp_name: str = "", group: Group | None = None) -> str | None:
    """The id of this pipeline's parent run, created by its first stage (None for a stage run outside a pipeline),
    or with `group` that group's parent run, found by its key tags (outside a pipeline too).

    `params`: the whole params file (every stage's sections), logged once; `tags`: lineage (git state) for a new
    parent. The parent is set RUNNING while a stage runs.
    """
    from mlflow.entities import Param

    if group is None and pipeline.startswith(STANDALONE):
        return None
    key = dict(group.key) if group else {ROLE_TAG: PIPELINE_ROLE, "vlmgym.pipeline_id": pipeline}
    found = client.search_runs([experiment_id], max_results=1,
                               filter_string=" and ".join(f"tags.`{k}` = '{v}'" for k, v in key.items()))
    process = dvc_process()
    writer = f"{temps.host_tag()}-{process[0]}" if process and not os.environ.get(PIPELINE_ID_ENV) else None
    if found:
        run_id = found[0].info.run_id
        if found[0].info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
        # A group's parent moves to the dvc process now running its stages: the one that created it may be gone,
        # and a RUNNING run whose writer is gone is closed as KILLED when a stage starts.
        if writer and found[0].data.tags.get("vlmgym.writer") != writer:
            client.set_tag(run_id, "vlmgym.writer", writer)
        return run_id
    parent_tags = {**key, **tags}
    if exp_name:
        parent_tags["dvc.exp_name"] = exp_name
    if writer:
        parent_tags["vlmgym.writer"] = writer
    name = group.name if group else exp_name or time.strftime("pipeline-%Y%m%d-%H%M%S")
    run = client.create_run(experiment_id, tags=parent_tags, run_name=name)
    flat = sorted(flat_params(group.params if group else params).items())
    for start in range(0, len(flat), _BATCH):
        client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in flat[start:start + _BATCH]])
    return run.info.run_id
