"""MLflow tracking: one run per stage, with params, metrics, artifacts and lineage.

Lineage tags let any result be traced back: the stage name, the git commit and
whether the tree was dirty (git_state), the DVC hashes (computed the way DVC
computes them) of the stage's dependencies and outputs as listed in dvc.yaml,
and a pipeline id shared by every stage run of one `dvc repro` / `dvc exp run`
(plus, under `dvc exp run`, the experiment's name, baseline and git ref:
experiment_tags).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import json
import os
import posixpath
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vlmgym.runtime import atomic, compile_cache, temps, write_hooks
from vlmgym.tracking import pipeline_run, run_recovery
from vlmgym.tracking import spool as spool_mod
from vlmgym.tracking.system_metrics import SystemMetrics
from vlmgym.tracking.system_metrics import next_step as next_system_step

PIPELINE_ID_ENV = pipeline_run.PIPELINE_ID_ENV
pipeline_id = pipeline_run.pipeline_id
# MLflow's HTTP client retries a failed call 7 times over minutes by default; a stage gives up sooner (its logs wait
# in the spool and are retried in the background). A value set in the environment wins.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
SYSTEM_METRICS_STAGES = ("sft", "train")  # the long ones, where CPU, memory and GPU use tell something
EXPS_DIR = Path(".dvc", "tmp", "exps")  # where DVC runs queued and --temp experiments, each in a temporary copy


def repo_root() -> Path:
    """The workspace the stage runs in: DVC's DVC_ROOT during a stage, else the git top level, else the cwd.

    A queued experiment (`dvc exp run --queue`) runs in a temporary copy, <repo>/.dvc/tmp/exps/<tmp>, while DVC
    points DVC_ROOT at <repo> (so that trackers log there): its stages' params, deps and outs are the copy's.
    """
    if os.environ.get("DVC_ROOT"):
        root = Path(os.environ["DVC_ROOT"])
        if not Path.cwd().is_relative_to(root / EXPS_DIR):
            return root
    try:  # the copy is a git checkout of its own
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True)
        return Path(out.stdout.strip())
    except (subprocess.CalledProcessError, FileNotFoundError):
        return Path.cwd()


def store_root() -> Path:
    """Where the default MLflow store lives: the repo root, or, for a DVC experiment that runs in a temporary
    workspace (`dvc exp run --queue` / `--temp` run in <repo>/.dvc/tmp/exps/<tmp>, deleted afterwards), the
    repository it came from, so that queued experiments log beside the others."""
    root = repo_root()
    parts = root.parts
    for i in range(len(parts) - 2):
        if parts[i:i + 3] == EXPS_DIR.parts:
            return Path(*parts[:i])
    return root


def tracking_uri(configured: str = "") -> str:
    """MLFLOW_TRACKING_URI wins, then the params value, then a SQLite file at the repo root (store_root)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    if configured:
        return configured
    return f"sqlite:///{store_root() / 'mlflow.db'}"


def open_experiment(uri: str, experiment: str) -> str:
    """Point MLflow at `uri` and make `experiment` the active one (created if new); returns its id.

    A SQLite store is created, migrated and given the experiment under an exclusive lock on a file beside it:
    processes started side by side on a fresh store (e.g. stages of several repositories sharing it) would otherwise
    race to create the same tables or experiment and all but one fail."""
    import fcntl

    import mlflow

    mlflow.set_tracking_uri(uri)
    if not uri.startswith("sqlite:"):
        return mlflow.set_experiment(experiment).experiment_id
    database = Path(uri.removeprefix("sqlite:///")).resolve()  # sqlite:///rel.db is relative to the cwd
    database.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{database}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if mlflow.get_experiment_by_name(experiment) is None:
            # Artifacts beside the SQLite file, not in whatever directory the stage happens to run from.
            mlflow.create_experiment(experiment, artifact_location=(database.parent / "mlartifacts").as_uri())
        return mlflow.set_experiment(experiment).experiment_id


def check_reachable(uri: str, timeout_s: float) -> None:
    """Stop at once, with one line naming the URI and the fix, when an http(s) tracking server does not answer
    within timeout_s (MLflow's own client would retry for minutes and then die with a long traceback). Any HTTP
    answer counts; other stores (a SQLite file, a folder) need no server."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # the server answered, with an error status for this path
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise SystemExit(f"vlmgym: the MLflow tracking server {uri} did not answer within {timeout_s:g} s "
                         f"({reason}): start it, or unset MLFLOW_TRACKING_URI and tracking.tracking_uri to log to "
                         "the local store (mlflow.db)") from None


GIT_CHANGED_SHOWN = 20  # paths named in the git.changed tag; more are counted
# What DVC writes in a repository while it runs a pipeline, besides the stages' outputs: each dvc.lock (rewritten
# and, with core.autostage, staged after every stage) and its temporary folder (a queued experiment's arguments
# file is committed into the experiment's stash and removed from the copy as the run starts).
DVC_WRITES = ("dvc.lock",)
DVC_TMP = ".dvc/tmp/"


def _placeholder_glob(path: str) -> str:
    """A dvc.yaml path as an fnmatch pattern: a matrix or foreach stage's `${...}` placeholders match anything."""
    return "*".join(glob.escape(part) for part in re.split(r"\$\{[^}]*\}", path))


def pipeline_outputs(root: Path, dvc_files: list[str]) -> list[str]:
    """fnmatch patterns of every output (outs, metrics, plots, top-level plots' files) of the given dvc.yaml files
    (paths from `root`)."""
    patterns = []
    for name in dvc_files:
        dvc_yaml = root / name
        try:
            stages = pipeline_run.dvc_file_stages(dvc_yaml, root)
            plots = pipeline_run.top_level_plots(dvc_yaml, root)
        except (OSError, yaml.YAMLError, AttributeError, TypeError, StopIteration):
            # A dvc.yaml that is gone or that DVC could not read either owns no files: what it names counts as changed
            continue
        patterns.extend(out for spec in stages.values() for out in spec["outs"])
        patterns.extend(plots)
    return [_placeholder_glob(p) for p in patterns]


def _matches(path: str, patterns: list[str]) -> bool:
    """Whether `path` is one of the outputs or lies inside one (a folder output)."""
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(path, p + "/*") for p in patterns)


def git_state(root: Path | None = None) -> dict[str, str]:
    """The commit checked out (`git.commit`) and whether tracked files other than the pipeline's own differ from it
    (`git.dirty`, and `git.changed`: those files, empty when none); 'unknown' outside git.

    The pipeline's own files are what DVC rewrites while a pipeline runs, so a stage that starts after others
    would otherwise see a clean checkout as dirty: every output of every dvc.yaml in the repository (DVC deletes
    a stage's outputs before it runs it, and its git-tracked metrics and plots are rewritten), each dvc.lock, DVC's
    .dvc/tmp/, and the lines DVC adds to a .gitignore for an output beside it. Under `dvc exp run` the commit is the
    experiment's baseline, and the experiment's own changes (its `-S` params) count: experiment_tags names where
    DVC records them."""
    root = root or Path.cwd()

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout

    try:
        commit, prefix = (git("rev-parse", "HEAD", "--show-prefix").split("\n") + [""])[:2]
        # -z: paths as they are (no quoting), a rename's old path after its new one
        status = git("status", "--porcelain=v1", "-z", "--untracked-files=no").split("\0")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return {"git.commit": "unknown", "git.dirty": "unknown"}
    paths, fields = [], iter(status)
    for entry in fields:
        if not entry:
            continue
        paths.append(entry[3:])
        if entry[0] in "RC":
            paths.append(next(fields, ""))
    changed = sorted({p for p in paths if p} - _pipeline_owned(root, prefix, {p for p in paths if p}, git))
    shown = ", ".join(changed[:GIT_CHANGED_SHOWN])
    if len(changed) > GIT_CHANGED_SHOWN:
        shown += f" (and {len(changed) - GIT_CHANGED_SHOWN} more)"
    # git.changed is set even when empty: a continued run's tags are set again, and must not keep an old list.
    return {"git.commit": commit.strip(), "git.dirty": str(bool(changed)).lower(), "git.changed": shown}


def _pipeline_owned(root: Path, prefix: str, paths: set[str], git: Any) -> set[str]:
    """Those of `paths` (from the git top level, which is `prefix` above `root`) that the pipeline owns
    (git_state)."""
    if not paths:
        return set()
    dvc_files = [p[len(prefix):] for p in git("ls-files", "-z", "--full-name", "--", ":(glob)**/dvc.yaml")
                 .split("\0") if p and p.startswith(prefix)]
    patterns = pipeline_outputs(root, sorted(set(dvc_files) | {"dvc.yaml"}))
    owned = set()
    for path in paths:
        if not path.startswith(prefix):
            continue  # outside the DVC project
        local = path[len(prefix):]
        name = posixpath.basename(local)
        if name in DVC_WRITES or local.startswith(DVC_TMP) or _matches(local, patterns) or \
                (name == ".gitignore" and _dvc_ignore_lines_only(root, path, local, patterns, git)):
            owned.add(path)
    return owned


def _dvc_ignore_lines_only(root: Path, path: str, local: str, patterns: list[str], git: Any) -> bool:
    """Whether a .gitignore differs from the commit's only by the lines DVC writes for outputs in its folder
    (`/<name>`, one per output it keeps out of git)."""
    try:
        before = git("show", f"HEAD:{path}")
    except subprocess.CalledProcessError:
        before = ""  # new since the commit
    file = root / local
    after = file.read_text() if file.exists() else ""
    folder = posixpath.dirname(local)
    lines = {line.strip() for line in set(before.splitlines()) ^ set(after.splitlines())} - {""}
    return all(line.startswith("/") and _matches(posixpath.join(folder, line[1:]), patterns) for line in lines)


EXPS_REFS = "refs/exps"  # where DVC keeps experiments' commits (dvc.repo.experiments.refs.ExpRefInfo)


def experiment_tags() -> dict[str, str]:
    """Under `dvc exp run` (DVC_EXP_NAME and DVC_EXP_BASELINE_REV, which DVC sets for an experiment's stages), the
    experiment's identity: `dvc.exp_name`, `dvc.exp_baseline_rev` (the commit it started from, which git.commit
    also names) and `dvc.exp_ref`, the git ref DVC commits the experiment to when it finishes (its params and
    dvc.lock; `dvc exp show`, `git show <ref>`). Empty outside an experiment."""
    name, baseline = os.environ.get("DVC_EXP_NAME", ""), os.environ.get("DVC_EXP_BASELINE_REV", "")
    tags = {}
    if name:
        tags["dvc.exp_name"] = name
    if baseline:
        tags["dvc.exp_baseline_rev"] = baseline
    if name and baseline:
        tags["dvc.exp_ref"] = f"{EXPS_REFS}/{baseline[:2]}/{baseline[2:]}/{name}"
    return tags


def dvc_hash(path: str | Path) -> str | None:
    """The md5 DVC records for a file or directory (None when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return None
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem

    fs = LocalFileSystem()
    with tempfile.TemporaryDirectory() as tmp:
        _, _, obj = build(HashFileDB(fs, tmp), str(path), fs, "md5", dry_run=True)
    return obj.hash_info.value


def stage_paths(stage: str, root: Path) -> dict[str, list[str]]:
    """The deps and outs (with metrics and plots) that dvc.yaml lists for a stage (empty when not a DVC stage)."""
    return pipeline_run.dvc_stages(root).get(stage, {"deps": [], "outs": []})


def _hash_tags(kind: str, paths: list[str], root: Path, hasher: Any = dvc_hash) -> dict[str, str]:
    tags = {}
    for p in paths:
        value = hasher(root / p)
        if value is not None:
            tags[f"dvc.{kind}.{p}"] = value
    return tags


def finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Finite numbers only (non-numbers are skipped rather than crashing a long run), under MLflow-safe names."""
    import math

    clean = {}
    for k, v in metrics.items():
        try:
            v = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            clean[k.replace("@", "_at_")] = v
    return clean


# Stage dependencies under this folder are datasets: logged as the run's inputs, with DVC's hash as the digest.
DATA_ROOT = "data/"


def log_inputs(dep_tags: Mapping[str, str], root: Path, stage: str, client: Any, run_id: str) -> None:
    """Log each data dependency (`dvc.dep.data/...` tags) as an MLflow dataset input of run `run_id`."""
    from mlflow.data.dataset_source_registry import get_registered_sources, resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    # MLflow registers a local-files source twice (for the "" and the "file" URI schemes, both named
    # LocalArtifactDatasetSource), so resolving a file:// URI among all sources warns that it "can be interpreted in
    # multiple ways" on every call. Naming the first one as the only candidate gives the same source, unwarned.
    local = [s for s in get_registered_sources() if s._get_source_type() == "local"][:1]
    inputs = []
    for tag, digest in dep_tags.items():
        path = tag.removeprefix("dvc.dep.")
        if path.startswith(DATA_ROOT):
            source = resolve_dataset_source((root / path).resolve().as_uri(), candidate_sources=local or None)
            dataset = MetaDataset(source, name=path, digest=digest)._to_mlflow_entity()
            inputs.append(DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, stage)]))
    if inputs:
        client.log_inputs(run_id, datasets=inputs)


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Opened:
    """The MLflow side of a stage run once the run exists (vlmgym.tracking.stage_runs.open_run)."""

    run: Any
    client: Any
    spool: spool_mod.Spool
    sender: spool_mod.Sender
    tags: dict[str, str]  # the lineage tags the run started with
    parent_id: str | None  # the pipeline's parent run (None outside DVC)
    logged_through: int  # a continued run already holds the steps through this one: they are not logged twice
    continued: bool


class TrackingNotOpened(RuntimeError):
    """The stage's MLflow run could not be created (the work may have gone on meanwhile)."""


class StageRun:
    """A handle on the MLflow run of a stage. Every call is queued on the run's spool (vlmgym.tracking.spool) and
    sent in the background, so an unreachable or failing server never blocks or kills the work.

    The run is opened in a background thread while the stage's work starts (importing MLflow and opening its store
    take seconds): what is queued before it exists waits in memory and goes first into its spool. The attributes
    that name the run (`run_id`, `parent_id`, `tags`, ...) wait for it."""

    def __init__(self, stage: str, opened: Opened | None = None):
        self.stage = stage
        self._output_hashes: dict[Path, str | None] = {}
        self._lock = threading.Lock()
        # (entry without its run id, the training step a continued run may already hold) queued before the run
        self._pending: list[tuple[dict[str, Any], int | None]] = []
        self._opened, self._error = opened, None
        self._ready = threading.Event()
        self.system: SystemMetrics | None = None
        self._opener: threading.Thread | None = None  # opens the run, then logs what it starts with
        if opened is not None:
            self._ready.set()

    def wait_for_run(self, *_: Any) -> None:
        """A write hook (vlmgym.runtime.write_hooks): the stage's outputs and checkpoints commit only once its run
        exists, so a stage killed inside a write always leaves a run to close as KILLED, and a resumed training the
        run to continue. The opening's own writes go on."""
        if threading.current_thread() is not self._opener:
            self._ready.wait()

    def open_in_background(self, request: OpenRequest) -> None:
        self._opener = threading.Thread(target=_open_into, args=(self, request), name="vlmgym-mlflow-open",
                                        daemon=True)
        self._opener.start()

    def attach(self, opened: Opened) -> None:
        """The run exists: what was queued goes into its spool, in order, less the steps it already holds."""
        with self._lock:
            for entry, step in self._pending:
                if step is None or step > opened.logged_through:
                    opened.spool.append({"kind": entry["kind"], "run_id": entry.get("run_id") or opened.run.info.run_id,
                                         **{k: v for k, v in entry.items() if k not in ("kind", "run_id")}})
            self._pending.clear()
            self._opened = opened
        self._ready.set()
        opened.sender.notify()

    def fail_to_open(self, err: BaseException) -> None:
        with self._lock:
            self._error = err
        self._ready.set()

    def opened(self) -> Opened:
        """The run, once it exists (waits for it); TrackingNotOpened when it could not be created."""
        self._ready.wait()
        if self._opened is None:
            err = self._error
            raise TrackingNotOpened(f"{self.stage}: its MLflow run could not be created ({type(err).__name__}: "
                                    f"{str(err).splitlines()[0][:300] if str(err) else ''})") from err
        return self._opened

    run = property(lambda self: self.opened().run)
    client = property(lambda self: self.opened().client)
    spool = property(lambda self: self.opened().spool)
    sender = property(lambda self: self.opened().sender)
    tags = property(lambda self: self.opened().tags)
    parent_id = property(lambda self: self.opened().parent_id)
    logged_through = property(lambda self: self.opened().logged_through)
    run_id = property(lambda self: self.opened().run.info.run_id)

    def _queue(self, kind: str, run_id: str | None = None, *, training_step: int | None = None,
               **fields: Any) -> None:
        with self._lock:
            opened, failed = self._opened, self._error is not None
            if opened is None and not failed:
                self._pending.append(({"kind": kind, "run_id": run_id, **fields}, training_step))
                return
            if opened is not None:
                opened.spool.append({"kind": kind, "run_id": run_id or opened.run.info.run_id, **fields})
        self.opened().sender.notify()  # raises TrackingNotOpened when the run could not be created

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Queue finite numeric metrics; non-numbers are skipped rather than crashing a long run."""
        opened = self._opened
        if opened is not None and step is not None and step <= opened.logged_through:
            return
        clean = finite_metrics(metrics)
        if clean:
            self._queue("metrics", training_step=step, step=step or 0, timestamp=_now_ms(), values=clean)

    def log_system_metrics(self, figures: Mapping[str, float], step: int) -> None:
        """A system metrics sample (vlmgym.tracking.system_metrics: its own step count, so no logged_through)."""
        clean = finite_metrics(figures)
        if clean:
            self._queue("metrics", step=step, timestamp=_now_ms(), values=clean)

    def log_params(self, params: Mapping[str, str]) -> None:
        if params:
            self._queue("params", values=dict(params))

    def output_hash(self, path: str | Path) -> str | None:
        """dvc_hash of a finished output, computed once per stage (the lineage of a registered model and the run's
        `dvc.out.*` tags need the same hash of what may be a multi-GB folder)."""
        key = Path(path).resolve()
        if key not in self._output_hashes:
            self._output_hashes[key] = dvc_hash(key)
        return self._output_hashes[key]

    def lineage(self, path: str | Path) -> dict[str, str]:
        """Tags tracing an output back to this run: its DVC hash, the git state, the pipeline and the run."""
        keep = ("git.commit", "git.dirty", "git.changed", "vlmgym.pipeline_id", "dvc.exp_name", "dvc.exp_ref",
                "dvc.exp_baseline_rev", "vlmgym.stage")
        tags = {key: self.tags[key] for key in keep if key in self.tags}
        return {**tags, "vlmgym.path": str(path), "dvc.hash": self.output_hash(path) or "missing",
                "vlmgym.run_id": self.run_id}

    def log_pipeline_results(self, metrics: Mapping[str, float]) -> None:
        """Also put these figures on the pipeline's parent run, so its row in the experiment table has them."""
        clean = finite_metrics(metrics)
        if self.parent_id and clean:
            self._queue("metrics", run_id=self.parent_id, step=0, timestamp=_now_ms(), values=clean)

    def link_pipeline(self, links: pipeline_run.Links) -> None:
        """Put a stage's references to the pipeline's stages on the parent run (pipeline_run.stage_links), and the
        curves of the stages DVC did not rerun."""
        if not self.parent_id:
            return
        for stage, path, digest in links.curves:
            self.copy_curve(stage, path, digest)
        if links.tags:
            self._queue("tags", run_id=self.parent_id, values=links.tags)

    def copy_curve(self, stage: str, path: Path, digest: str | None) -> None:
        """Copy a training stage's curve file onto the parent run, each step's figures under `<stage>/` at their
        step, then tag which file it was (after the figures: a later stage that finds the tag finds them too)."""
        if not self.parent_id or not path.exists():
            return
        try:
            curve = pipeline_run.read_curve(path)
        except (OSError, ValueError) as err:  # a copy for the parent's table: never a reason to fail the stage
            print(f"vlmgym: {stage}'s curve is not copied onto the pipeline's parent run: {err}", file=sys.stderr,
                  flush=True)
            return
        now = _now_ms()
        for step, values in pipeline_run.parent_curve(stage, curve):
            self._queue("metrics", run_id=self.parent_id, step=step, timestamp=now, values=values)
        self._queue("tags", run_id=self.parent_id, values={pipeline_run.STAGE_CURVE_TAG + stage: digest or "missing"})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Queue a file or folder (copied into the spool now, so a temporary may go away)."""
        path = Path(path)
        # A folder is logged under its own name, as mlflow.log_artifact does.
        target = "/".join(p for p in (artifact_path, path.name) if p) if path.is_dir() else artifact_path
        self._queue("artifact", file=self.spool.keep_file(path), artifact_path=target)

    def _log_bytes(self, data: bytes, name: str) -> None:
        folder, _, base = name.rpartition("/")
        self._queue("artifact", file=self.spool.write_file(base, data), artifact_path=folder or None)

    def log_dict(self, obj: Any, name: str) -> None:
        self._log_bytes((json.dumps(obj, indent=2) + "\n").encode(), name)

    def log_text(self, text: str, name: str) -> None:
        self._log_bytes(text.encode(), name)

    def log_sample_table(self, step: int, rows: list[dict]) -> None:
        """Sample rollouts of a training step: an MLflow table (`samples/table_step_NNNNNN.json`: step, index,
        answer, reward and components, compared across runs in the UI's evaluation view), each row's first image as
        an MLflow image with its step (`sample_NN`), and the artifact folder samples/step_NNNNNN/ (table.json +
        every image as JPEG); rows have index, images (PIL), answer, reward, reward_components. The folder is
        written straight into the spool, and the images' entries point into it."""
        if step <= self.logged_through:
            return
        folder = self.spool.new_folder(f"step_{step:06d}")
        table = []
        for i, row in enumerate(rows):
            images = []
            for j, image in enumerate(row["images"]):
                name = f"{i:02d}_{j}.jpg"
                image.convert("RGB").save(folder / name, quality=85)
                images.append(name)
            table.append({"index": row["index"], "images": images, "answer": row["answer"],
                          "reward": row["reward"], "reward_components": row["reward_components"]})
        (folder / "table.json").write_text(json.dumps(table, indent=2) + "\n")
        self._queue("artifact", file=self.spool.relative(folder), artifact_path=f"samples/{folder.name}")
        for i, entry in enumerate(table):
            if entry["images"]:
                self._queue("image", file=self.spool.relative(folder / entry["images"][0]), key=f"sample_{i:02d}",
                            step=step, timestamp=_now_ms())
        columns = {"step": [step] * len(table), "index": [r["index"] for r in table],
                   "answer": [r["answer"] for r in table], "reward": [float(r["reward"]) for r in table],
                   "reward_components": [json.dumps(r["reward_components"], sort_keys=True) for r in table]}
        self._queue("table", data=columns, artifact_file=f"samples/table_step_{step:06d}.json")

    def queue_model_entry(self, kind: str, **fields: Any) -> None:
        """Queue a model registry call, `register` or `promote` (vlmgym.tracking.model_registry.send_entry)."""
        self._queue(kind, **fields)

    def register_model(self, hf_dir: str | Path, env_name: str, *, max_new_tokens: int) -> None:
        """Queue the registration of the exported folder `hf_dir` as a version of `vlmgym-<env>`, with lineage."""
        from vlmgym.tracking import model_registry

        self._queue("register", **model_registry.registration(hf_dir, env_name, max_new_tokens,
                                                              self.lineage(hf_dir)))

    def wait_sent(self) -> bool:
        """Wait while the server takes what is queued: True once it has it all, False as soon as a send fails (the
        entries stay queued and are retried). No time limit: a large model's upload takes the time it takes."""
        self.sender.notify()
        while not self.spool.is_sent():
            if self.sender.outage_since is not None:
                return False
            time.sleep(0.05)
        return True

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if tags:
            self._queue("tags", values={k: str(v) for k, v in tags.items()})

    def end(self, status: str, parent_status: str | None, flush_timeout_s: float) -> bool:
        """Queue the end of the run (and the parent's status), wait up to flush_timeout_s for the server to take
        everything; whether it did. What it did not take stays in the spool."""
        now = _now_ms()
        self._queue("terminate", status=status, timestamp=now)
        if self.parent_id and parent_status:
            self._queue("terminate", run_id=self.parent_id, status=parent_status, timestamp=now)
        sent = self.sender.flush(flush_timeout_s)
        self.sender.stop()
        if sent:
            self.spool.remove()
        else:
            self.spool.release()
            print(f"vlmgym: MLflow ({self.spool.tracking_uri}) has not taken all of run {self.run_id}'s logs; "
                  f"they wait in {self.spool.folder}: the next stage sends them, or run `vlmgym tracking sync`",
                  file=sys.stderr, flush=True)
        return sent


    def close(self, status: str, flush_timeout_s: float) -> None:
        """End the run with `status` once it exists. A run that could not be created fails a stage whose work
        succeeded (TrackingNotOpened); under a failing body it is only reported, the body's error goes on."""
        if self._opener is not None:  # all it logs (params, the pipeline's references) goes before the end
            self._opener.join()
        try:
            self.opened()
        except TrackingNotOpened as err:
            if status == "FINISHED":
                raise
            print(f"vlmgym: {err}", file=sys.stderr, flush=True)
            return
        if self.system is not None:
            self.system.stop()
        self.end(status, status if self.parent_id else None, flush_timeout_s)


def _root_pipeline_stage(stage: str, root: Path) -> bool:
    """Whether DVC runs `stage` from the dvc.yaml at `root`: DVC_STAGE (which DVC sets for a stage's command) is
    the bare stage name for that file's stages and `<dvc.yaml path>:<stage>` for another's. Outside DVC it is
    unset, and the stage counts as the pipeline's own."""
    addressing = os.environ.get("DVC_STAGE")
    if addressing is None or addressing == stage:
        return True
    file, _, name = addressing.rpartition(":")
    return name == stage and (Path.cwd() / file).resolve() == (root / "dvc.yaml").resolve()


def _stage_links(client: Any, experiment_id: str, parent: str, stage: str, run_id: str,
                 root: Path) -> pipeline_run.Links:
    """pipeline_run.stage_links, or none with a warning: the references are lineage, never a reason to stop the
    stage's work (the server answered a moment ago, but a dvc.lock being rewritten or a search may still fail)."""
    try:
        return pipeline_run.stage_links(client, experiment_id, parent, stage, run_id, root, hasher=dvc_hash)
    except Exception as err:
        print(f"vlmgym: {stage}: the pipeline's parent run {parent} gets no references to the other stages "
              f"({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})", file=sys.stderr,
              flush=True)
        return pipeline_run.Links()


@dataclass(frozen=True)
class OpenRequest:
    """What opening a stage's MLflow run needs (stage_run gathers it, open_run acts on it)."""

    stage: str
    root: Path
    uri: str
    experiment: str
    params_file: Path
    paths: Mapping[str, list[str]]
    logged: Mapping[str, str]  # the stage's params, flat
    group: pipeline_run.Group | None
    resume_folder: str | Path | None
    whole_pipeline: bool
    system_metrics: bool


def _start_run(client: Any, experiment_id: str, run_name: str, tags: Mapping[str, str],
               continued: run_recovery.Continued | None) -> Any:
    """A new run, or the continued one set RUNNING again with the new tags on top, as mlflow.start_run does
    (without making it the active run of any thread)."""
    from mlflow.entities import RunTag
    from mlflow.tracking.context import registry as context_registry
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    if continued:
        client.update_run(continued.run_id, status="RUNNING")
        client.log_batch(continued.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        return client.get_run(continued.run_id)
    resolved = context_registry.resolve_tags({**tags, MLFLOW_RUN_NAME: run_name})
    return client.create_run(experiment_id, tags=resolved, run_name=run_name)


def open_run(req: OpenRequest) -> Opened:
    """Create (or continue) the stage's run under its pipeline's parent, with its lineage tags and inputs."""
    from mlflow.tracking import MlflowClient

    experiment_id = open_experiment(req.uri, req.experiment)
    exp_name = os.environ.get("DVC_EXP_NAME", "")
    pipeline, git = pipeline_id(), {**git_state(req.root), **experiment_tags()}
    dep_tags = _hash_tags("dep", req.paths["deps"], req.root)
    tags = {pipeline_run.STAGE_TAG: req.stage, "vlmgym.pipeline_id": pipeline, **git, **dep_tags}
    client = MlflowClient(req.uri)
    run_recovery.close_dead_runs(client, experiment_id)
    all_params = (yaml.safe_load(req.params_file.read_text()) or {}) if req.params_file.exists() else {}
    parent = pipeline_run.parent_run(client, experiment_id, pipeline, params=all_params, tags=git,
                                     exp_name=exp_name, group=req.group)
    if parent:
        tags[pipeline_run.PARENT_TAG] = parent  # a continued training run moves to the pipeline finishing it
    tags[run_recovery.WRITER_TAG] = atomic.writer_tag()
    # Logs an earlier stage could not send (its server was down as it ended) go first: a continued run's
    # steps are then all on the server when it counts them.
    spool_mod.sync(store_root(), client_for=lambda _uri: client, only_uri=req.uri)
    continued = run_recovery.run_to_continue(req.resume_folder, client, req.uri) if req.resume_folder else None
    if continued:
        tags[run_recovery.RESUMED_TAG] = str(continued.resumed_times + 1)
        print(f"{req.stage}: continuing MLflow run {continued.run_id} (steps through {continued.logged_through} "
              "already logged)", file=sys.stderr)
    run = _start_run(client, experiment_id, f"{exp_name}/{req.stage}" if exp_name else req.stage, tags, continued)
    spool = spool_mod.run_spool(store_root(), run.info.run_id, req.uri)
    if req.resume_folder:
        run_recovery.remember_run(req.resume_folder, run.info.run_id, req.uri)
    log_inputs(dep_tags, req.root, req.stage, client, run.info.run_id)
    logged_through = max(continued.logged_through if continued else -1, spool.max_step(run.info.run_id))
    return Opened(run, client, spool, spool_mod.Sender(spool, client), tags, parent, logged_through,
                  continued is not None)


def _open_into(handle: StageRun, req: OpenRequest) -> None:
    """open_run, then what the new run gets first: its params, the pipeline's references, system metrics."""
    try:
        opened = open_run(req)
    except BaseException as err:  # noqa: BLE001 - handed to the stage's thread, which raises it
        handle.fail_to_open(err)
        return
    handle.attach(opened)
    if not opened.continued:  # a continued run has them, and MLflow refuses to log a param twice
        handle.log_params(dict(req.logged))
    if opened.parent_id and req.whole_pipeline:
        handle.link_pipeline(_stage_links(opened.client, opened.run.info.experiment_id, opened.parent_id,
                                          req.stage, opened.run.info.run_id, req.root))
    if req.system_metrics:
        handle.system = SystemMetrics(handle.log_system_metrics, first_step=next_system_step(opened.run))


@contextlib.contextmanager
def stage_run(stage: str, params: Any = None, *, experiment: str | None = None,
              extra_params: Mapping[str, Any] | None = None,
              params_file: str | Path | None = None, resume_folder: str | Path | None = None,
              group: pipeline_run.Group | None = None,
              paths: Mapping[str, list[str]] | None = None) -> Iterator[StageRun]:
    """Run a pipeline stage inside one MLflow run with its params and lineage tags.

    `params` is the stage's params section (a dataclass or a mapping). The
    experiment and tracking URI come from the `tracking` section of `params_file`
    (the stage's --params; default: params.yaml at the repo root) unless given.
    An http(s) server that does not answer stops the stage at once; the run itself
    is opened in a background thread while the body starts (open_run): runs left
    RUNNING by dead processes are closed as KILLED first; with `resume_folder` (a
    training stage's checkpoint folder) the unfinished run that trained into it is
    continued. Under DVC the run is nested in its pipeline's parent run
    (vlmgym.tracking.pipeline_run), which gets the whole params file and follows the
    stage's status. Everything logged goes through the run's spool
    (vlmgym.tracking.spool): the body never waits for the server, and the end waits
    at most tracking.flush_timeout_s for it. Output hashes are tagged after the body
    succeeds. A run that could not be created fails the stage (TrackingNotOpened) at
    the next call that logs, or at the end.

    Entering it turns on the compilation cache (vlmgym.runtime.compile_cache) for the stage's process, before its
    first compile.

    A stage of another dvc.yaml (a study's, vlmgym.compare.study) passes its `paths` ({"deps": [...], "outs":
    [...]} from the repo root: the top-level dvc.yaml does not list it) and its `group`, the parent it nests under
    instead of the pipeline's.
    """
    from vlmgym import params as params_mod

    compile_cache.enable()  # before the stage's first compile, which decides whether the process uses it
    root = repo_root()
    # Any stage run clears what killed runs of any stage left (a stage DVC restores from its run-cache does
    # not run, so its own next write cannot be relied on to do it).
    temps.sweep([root / name for name in temps.OUTPUT_ROOTS])
    params_file = Path(params_file) if params_file is not None else root / "params.yaml"
    tracking_cfg = (params_mod.load_section("tracking", params_file) if params_file.exists()
                    else params_mod.TrackingParams())
    uri = tracking_uri(tracking_cfg.tracking_uri)
    check_reachable(uri, tracking_cfg.connect_timeout_s)
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    # A stage of the repository's dvc.yaml: its parent run gets references to the whole pipeline and the training
    # stages' curves (a study's stages run the same scripts from their own dvc.yaml, which the parent is not).
    whole_pipeline = paths is None and group is None and _root_pipeline_stage(stage, root)
    paths = dict(paths) if paths is not None else stage_paths(stage, root)
    logged = pipeline_run.flat_params(params) if params is not None else {}
    logged.update(pipeline_run.flat_params(extra_params or {}))
    request = OpenRequest(stage, root, uri, experiment or tracking_cfg.experiment, params_file, paths, logged,
                          group, resume_folder, whole_pipeline,
                          tracking_cfg.system_metrics and stage in SYSTEM_METRICS_STAGES)
    handle = StageRun(stage)
    handle.open_in_background(request)
    hooks = (write_hooks.before_rename, write_hooks.at_checkpoint_save)
    for hook_list in hooks:
        hook_list.insert(0, handle.wait_for_run)  # before any other hook (the kill-in-write test hook)
    status = "FAILED"
    curve = pipeline_run.curve_file(stage)
    try:
        yield handle
        handle.set_tags(_hash_tags("out", paths["outs"], root, hasher=handle.output_hash))
        if whole_pipeline and curve in paths["outs"] and handle.parent_id:
            handle.copy_curve(stage, root / curve, handle.output_hash(root / curve))
        status = "FINISHED"
    finally:
        try:
            handle.close(status, tracking_cfg.flush_timeout_s)
        finally:
            for hook_list in hooks:
                hook_list.remove(handle.wait_for_run)
