"""One MLflow parent run per pipeline run, the stage runs nested under it.

A pipeline run is one `dvc repro` or one `dvc exp run` (a queued experiment runs in its own DVC process, so it
is one too): its id names the DVC process that runs the stages (`vlmgym.pipeline_id`). The first stage that
starts creates the parent run (tag `vlmgym.role` = `pipeline`) with every section of params.yaml as its params,
the DVC experiment name as its run name, the git state (with, under `dvc exp run`, the experiment's
identity: vlmgym.tracking.stage_runs.experiment_tags), and the DVC process as its writer (so a killed
`dvc repro` leaves no RUNNING parent: vlmgym.tracking.run_recovery closes it like a stage run). Each stage run points at
it with MLflow's `mlflow.parentRunId` tag, which is what `mlflow ui` nests by; the evaluate stage copies its
headline figures onto it (those of metrics/headline.json, under the evaluate run's names, e.g.
`grpo_minus_sft/mean_reward`; the evaluate run itself keeps every figure), so one row of the experiment table holds
one pipeline's params and results, few enough to read:

    mlflow.search_runs(experiment_names=["vlmgym"], filter_string="tags.`vlmgym.role` = 'pipeline'")

The parent's status follows its stages: RUNNING while one runs, FINISHED after one succeeds, FAILED after one
fails.

The parent names every stage of dvc.yaml, not only those this pipeline run reran (stage_links): tag
`vlmgym.stage_run.<stage>` is the MLflow run whose outputs the pipeline used, and `vlmgym.stage_cached.<stage>` says
whether DVC reran the stage here (`false`: the run is nested under this parent) or took its outputs as they were
(`true`: the run is the one whose `dvc.out.*` tags hold the hashes dvc.lock records for the stage; `unknown` when
this experiment has no such run). A training stage's per-step curve (its `metrics/curves/<stage>.jsonl` output,
vlmgym.tracking.step_curve) is copied onto the parent under the stage's name, `sft/loss` or `train/reward_mean` at
each step, once the stage has written it, or, for a stage DVC did not rerun, from that output as dvc.lock records
it; tag `vlmgym.stage_curve.<stage>` holds the copied file's DVC hash.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vlmgym.runtime import temps

PIPELINE_ID_ENV = "VLMGYM_PIPELINE_ID"
ROLE_TAG = "vlmgym.role"
PIPELINE_ROLE = "pipeline"
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag
STANDALONE = "standalone-"
_BATCH = 100  # MLflow's limit of params per log_batch call
STAGE_TAG = "vlmgym.stage"
STAGE_RUN_TAG = "vlmgym.stage_run."  # + stage name, on the parent: the run whose outputs the pipeline used
STAGE_CACHED_TAG = "vlmgym.stage_cached."  # + stage name: "true" when DVC did not rerun the stage in this pipeline
STAGE_CURVE_TAG = "vlmgym.stage_curve."  # + stage name: the DVC hash of the curve file copied onto the parent
UNKNOWN = "unknown"
# A training stage's per-step figures, one JSON object a line, {"step": int, "metrics": {name: float}}, each step
# once, by step (vlmgym.tracking.step_curve writes them). Read here, so that any stage can copy the curve of a
# training stage DVC did not rerun onto its pipeline's parent run.
CURVES_DIR = "metrics/curves"

Curve = dict[int, dict[str, float]]  # {step: {metric: value}}


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


def curve_file(stage: str) -> str:
    """The curve output of training stage `stage` (dvc.yaml lists it among the stage's outs)."""
    return f"{CURVES_DIR}/{stage}.jsonl"


def curve_entry(text: str, where: str) -> tuple[int, dict[str, float]]:
    """(step, figures) of one curve line; ValueError naming `where` for anything else."""
    try:
        entry = json.loads(text)
        step, metrics = entry["step"], entry["metrics"]
        if isinstance(step, bool) or not isinstance(step, int) or not isinstance(metrics, dict):
            raise ValueError("not {\"step\": int, \"metrics\": {...}}")
        return step, {str(name): float(value) for name, value in metrics.items()}
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{where}: not a curve entry ({err}): {text[:200]!r}") from None


def read_curve(path: str | Path) -> Curve:
    """{step: figures} of a curve file (every line complete, each step once)."""
    path = Path(path)
    curve: Curve = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        step, metrics = curve_entry(line, f"{path}:{number}")
        if step in curve:
            raise ValueError(f"{path}:{number}: step {step} again")
        curve[step] = metrics
    return curve


def parent_curve(stage: str, curve: Curve) -> list[tuple[int, dict[str, float]]]:
    """A stage's curve as the parent run holds it: each step's figures under `<stage>/<name>`, by step."""
    return [(step, {f"{stage}/{name}": value for name, value in curve[step].items()})
            for step in sorted(curve) if curve[step]]


def _names(entries: list | None) -> list[str]:
    return [e if isinstance(e, str) else next(iter(e)) for e in entries or []]


def dvc_file_stages(dvc_yaml: Path, root: Path) -> dict[str, dict[str, list[str]]]:
    """{stage: {"deps": [...], "outs": [...]}} of one dvc.yaml, paths from `root` (each stage's `wdir` applied);
    outs are its outs, metrics and plots. A matrix or foreach stage's paths keep their `${...}` placeholders."""
    spec = yaml.safe_load(dvc_yaml.read_text()) or {}
    folder = dvc_yaml.parent.relative_to(root).as_posix()
    stages = {}
    for name, stage in (spec.get("stages") or {}).items():
        wdir = posixpath.join(folder, stage.get("wdir", "."))
        outs = [p for kind in ("outs", "metrics", "plots") for p in _names(stage.get(kind))]
        stages[name] = {"deps": [posixpath.normpath(posixpath.join(wdir, p)) for p in _names(stage.get("deps"))],
                        "outs": [posixpath.normpath(posixpath.join(wdir, p)) for p in outs]}
    return stages


def dvc_stages(root: Path) -> dict[str, dict[str, list[str]]]:
    """dvc_file_stages of the pipeline's own dvc.yaml, at `root` (empty without one)."""
    dvc_yaml = root / "dvc.yaml"
    return dvc_file_stages(dvc_yaml, root) if dvc_yaml.exists() else {}


def top_level_plots(dvc_yaml: Path, root: Path) -> list[str]:
    """The files a dvc.yaml's top-level `plots` section names (a plot's id when it is a file, and the files of its
    `x` and `y`), from `root`."""
    spec = yaml.safe_load(dvc_yaml.read_text()) or {}
    folder = dvc_yaml.parent.relative_to(root).as_posix()
    files = []
    for entry in spec.get("plots") or []:
        for plot_id, plot in (entry.items() if isinstance(entry, dict) else [(entry, None)]):
            files.append(plot_id)
            for axis in ("x", "y"):
                if isinstance(plot, dict) and isinstance(plot.get(axis), dict):
                    files.extend(plot[axis])
    return [posixpath.normpath(posixpath.join(folder, f)) for f in files]


def lock_outs(root: Path) -> dict[str, dict[str, str]]:
    """{stage: {out path: DVC hash}} as dvc.lock at `root` records them (empty without one)."""
    lock = root / "dvc.lock"
    if not lock.exists():
        return {}
    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages") or {}
    return {name: {out["path"]: out["md5"] for out in entry.get("outs") or [] if "md5" in out}
            for name, entry in stages.items()}


def _within(path: str, other: str) -> bool:
    return path == other or path.startswith(other.rstrip("/") + "/") or other.startswith(path.rstrip("/") + "/")


def upstream(stage: str, stages: Mapping[str, Mapping[str, list[str]]]) -> set[str]:
    """The stages whose outputs `stage` depends on, directly or through other stages."""
    found: set[str] = set()
    todo = [stage]
    while todo:
        deps = stages.get(todo.pop(), {}).get("deps", [])
        for name, spec in stages.items():
            if name not in found and any(_within(d, o) for d in deps for o in spec["outs"]):
                found.add(name)
                todo.append(name)
    found.discard(stage)
    return found


def producing_run(client: Any, experiment_id: str, stage: str, outs: Mapping[str, str]) -> str | None:
    """The newest run of `stage` in the experiment whose `dvc.out.*` tags hold exactly these hashes: the run that
    wrote the outputs (None when there is none, e.g. they were written before this store existed)."""
    if not outs:
        return None
    conditions = [f"tags.`{STAGE_TAG}` = '{stage}'",
                  *(f"tags.`dvc.out.{path}` = '{digest}'" for path, digest in sorted(outs.items()))]
    found = client.search_runs([experiment_id], " and ".join(conditions), max_results=1,
                               order_by=["attributes.start_time DESC"])
    return found[0].info.run_id if found else None


@dataclass
class Links:
    """What a stage adds to its pipeline's parent run when it starts: `tags` (those the parent lacks or holds with
    another value) and `curves`, the curve files of stages DVC did not rerun, to copy (stage, path, DVC hash)."""

    tags: dict[str, str] = field(default_factory=dict)
    curves: list[tuple[str, Path, str]] = field(default_factory=list)


def stage_links(client: Any, experiment_id: str, parent_id: str, stage: str, run_id: str, root: Path,
                hasher: Callable[[Path], str | None]) -> Links:
    """The parent's references to every stage of the pipeline (module docstring), as `stage` (run `run_id`) starts.

    A stage that ran under this parent is its run there. Any other stage dvc.lock records is the run that wrote the
    outputs dvc.lock records: the stages before `stage` are final by now, and one after it that DVC reruns later
    puts its own run in place when it starts (one DVC skips keeps its dvc.lock entry, so its reference holds). Only
    the curves of stages upstream of `stage` are copied, and only when the file in the workspace is the one
    dvc.lock records (`hasher`: vlmgym.tracking.stage_runs.dvc_hash), so the parent never holds a curve a later
    stage of the same run replaces."""
    stages = dvc_stages(root)
    nested = client.search_runs([experiment_id], f"tags.`{PARENT_TAG}` = '{parent_id}'",
                                max_results=1000, order_by=["attributes.start_time ASC"])
    ran_here = {r.data.tags[STAGE_TAG]: r.info.run_id for r in nested if STAGE_TAG in r.data.tags}
    ran_here[stage] = run_id
    current = client.get_run(parent_id).data.tags
    locked = lock_outs(root)
    before = upstream(stage, stages)
    links = Links()
    wanted: dict[str, str] = {}
    for name in stages:
        if name in ran_here:
            wanted.update({STAGE_RUN_TAG + name: ran_here[name], STAGE_CACHED_TAG + name: "false"})
            continue
        outs = locked.get(name)
        if not outs:
            continue  # never run here: nothing to name
        wanted.update({STAGE_RUN_TAG + name: producing_run(client, experiment_id, name, outs) or UNKNOWN,
                       STAGE_CACHED_TAG + name: "true"})
        curve = curve_file(name)
        if name in before and curve in outs and STAGE_CURVE_TAG + name not in current \
                and hasher(root / curve) == outs[curve]:
            links.curves.append((name, root / curve, outs[curve]))
    links.tags = {key: value for key, value in wanted.items() if current.get(key) != value}
    return links
