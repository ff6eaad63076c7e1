"""MLflow logging that never blocks or kills the work: a journal on disk, sent by a background thread.

Each call a stage makes once its run exists (metrics, params, tags, artifacts, sample tables, the end of the run)
is appended to a journal in the run's spool folder, `mlflow-spool/<run id>/` beside the local store, and a
background thread sends the journal in order. A failed send (the server is down, restarting or erroring) is retried
with backoff, with one warning per outage, while the steps go on. `sent.json` records how much of the journal the
server has, so an entry is sent once; after an outage the entries at the resume point are first looked up on the
server (a batch the server stored before its answer was lost is not sent twice). The folder is removed once all
of it is sent. When the stage ends with the server still down, the journal stays: the next stage of the same store
sends it, or `vlmgym tracking sync`, oldest journal first.

The model registry's calls go through the journal too: the export stage's registration of its folder and the
evaluate stage's decision on the `champion` alias (entries `register` and `promote`, sent by
vlmgym.tracking.model_registry.send_entry), so an outage delays them and never loses them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vlmgym.runtime.atomic import write_text_atomically

SPOOL_DIR = "mlflow-spool"
JOURNAL, SENT, META, LOCK, FILES = "journal.jsonl", "sent.json", "meta.json", "lock", "files"
MAX_METRICS_PER_BATCH = 1000  # MLflow's limit per log_batch call
MAX_PARAMS_PER_BATCH = 100
RETRY_DELAYS_S = (1, 2, 4, 8, 15)  # then every 15 s


class SpoolBusy(RuntimeError):
    """Another live process sends this spool."""


class Spool:
    """One run's journal of MLflow calls and the byte offset up to which the server has it."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.journal = self.folder / JOURNAL
        meta = self.folder / META
        self.tracking_uri = json.loads(meta.read_text())["tracking_uri"] if meta.exists() else None
        self._write_lock = threading.Lock()
        self._lock_file: Any = None

    def set_uri(self, tracking_uri: str) -> None:
        """Where the journal goes (written once claimed: `sync` passes over a spool without it), and when the
        spool was first made (`sync` sends the oldest first)."""
        write_text_atomically(self.folder / META, json.dumps({"tracking_uri": tracking_uri,
                                                              "created": self.created() or time.time()}) + "\n")
        self.tracking_uri = tracking_uri

    def created(self) -> float | None:
        try:
            return float(json.loads((self.folder / META).read_text())["created"])
        except (OSError, ValueError, KeyError):
            return None

    def _drop_torn_tail(self) -> None:
        """A process killed inside a write leaves a partial last line: cut it, so appends start on a new line."""
        if not self.journal.exists():
            return
        data = self.journal.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.journal, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def claim(self, wait: bool = False) -> None:
        """Hold the spool for this process (released when it ends, however it ends), then cut a partial last line
        a killed writer left; SpoolBusy if another process holds it (with `wait`, wait for it instead)."""
        self._lock_file = open(self.folder / LOCK, "w")  # noqa: SIM115 (held open until released)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            self._lock_file.close()
            self._lock_file = None
            raise SpoolBusy(f"{self.folder} is being sent by another process") from None
        self._drop_torn_tail()

    def release(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def append(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, sort_keys=True, allow_nan=False) + "\n"
        with self._write_lock, open(self.journal, "a") as f:
            f.write(line)
            f.flush()

    def _new_slot(self) -> Path:
        """A fresh folder under files/ (numbered in order of use)."""
        with self._write_lock:
            files = self.folder / FILES
            slot = files / str(sum(1 for _ in files.iterdir()) if files.exists() else 0)
            slot.mkdir(parents=True)
        return slot

    def relative(self, path: Path) -> str:
        """How a journal entry names a file kept in the spool."""
        return str(path.relative_to(self.folder))

    def new_folder(self, name: str) -> Path:
        """An empty folder called `name` in the spool, for a caller to write an artifact folder straight into."""
        folder = self._new_slot() / name
        folder.mkdir()
        return folder

    def keep_file(self, source: str | Path, name: str | None = None) -> str:
        """Copy a file or folder into the spool (the original may be a temporary); its path inside the spool."""
        source = Path(source)
        dest = self._new_slot() / (name or source.name)
        if source.is_dir():
            shutil.copytree(source, dest)
        else:
            shutil.copyfile(source, dest)
        return self.relative(dest)

    def write_file(self, name: str, data: bytes) -> str:
        """Keep `data` as a file called `name` in the spool; its path inside the spool."""
        dest = self._new_slot() / name
        dest.write_bytes(data)
        return self.relative(dest)

    def sent_offset(self) -> int:
        try:
            return int(json.loads((self.folder / SENT).read_text())["offset"])
        except (OSError, ValueError, KeyError):
            return 0

    def mark_sent(self, offset: int) -> None:
        write_text_atomically(self.folder / SENT, json.dumps({"offset": offset}) + "\n")

    def pending(self) -> list[tuple[int, dict[str, Any]]]:
        """The unsent entries, each with the journal offset just past it (complete lines only)."""
        if not self.journal.exists():
            return []
        with open(self.journal, "rb") as f:
            f.seek(self.sent_offset())
            data = f.read()
        out, offset = [], self.sent_offset()
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break
            offset += len(line)
            out.append((offset, json.loads(line)))
        return out

    def is_sent(self) -> bool:
        return not self.journal.exists() or self.sent_offset() >= self.journal.stat().st_size

    def max_step(self, run_id: str) -> int:
        """The last metrics step this journal holds for the run, sent or not (-1: none)."""
        if not self.journal.exists():
            return -1
        steps = [e.get("step", -1) for e in map(json.loads, self.journal.read_text().splitlines())
                 if e["kind"] == "metrics" and e["run_id"] == run_id]
        return max(steps, default=-1)

    def remove(self) -> None:
        self.release()
        shutil.rmtree(self.folder, ignore_errors=True)


def _already_stored(client: Any, entry: dict[str, Any]) -> bool:
    """Whether the server holds this metrics entry already (a batch stored before its answer was lost)."""
    if entry["kind"] != "metrics" or not entry["values"]:
        return False
    key = min(entry["values"])
    history = client.get_metric_history(entry["run_id"], key)
    return any(m.step == entry["step"] and m.timestamp == entry["timestamp"] for m in history)


def _batches(entries: list[tuple[int, dict[str, Any]]]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Consecutive metrics entries of one run merged into log_batch-sized groups; everything else alone."""
    group: list[dict[str, Any]] = []
    end = 0
    for offset, entry in entries:
        mergeable = entry["kind"] == "metrics" and (not group or group[0]["run_id"] == entry["run_id"]) and \
            sum(len(e["values"]) for e in group) + len(entry["values"]) <= MAX_METRICS_PER_BATCH
        if group and not mergeable:
            yield end, group
            group = []
        group.append(entry)
        end = offset
        if entry["kind"] != "metrics":
            yield end, group
            group = []
    if group:
        yield end, group


def _send(client: Any, folder: Path, group: list[dict[str, Any]], tracking_uri: str | None) -> None:
    from mlflow.entities import Metric, Param, RunTag

    first = group[0]
    run_id, kind = first["run_id"], first["kind"]
    if kind == "metrics":
        client.log_batch(run_id, metrics=[Metric(k, float(v), e["timestamp"], e["step"])
                                          for e in group for k, v in sorted(e["values"].items())])
    elif kind == "params":
        items = sorted(first["values"].items())
        for start in range(0, len(items), MAX_PARAMS_PER_BATCH):
            client.log_batch(run_id, params=[Param(k, v) for k, v in items[start:start + MAX_PARAMS_PER_BATCH]])
    elif kind == "tags":
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in sorted(first["values"].items())])
    elif kind == "artifact":
        path = folder / first["file"]
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path=first.get("artifact_path"))
        else:
            client.log_artifact(run_id, str(path), artifact_path=first.get("artifact_path"))
    elif kind == "table":
        with warnings.catch_warnings():  # MLflow's log_table trips a pandas deprecation of its own
            warnings.filterwarnings("ignore", message="For backward compatibility, 'str' dtypes")
            client.log_table(run_id, data=first["data"], artifact_file=first["artifact_file"])
    elif kind == "image":
        from PIL import Image

        with Image.open(folder / first["file"]) as image:
            client.log_image(run_id, image.convert("RGB"), key=first["key"], step=first["step"],
                             timestamp=first["timestamp"], synchronous=True)
    elif kind == "terminate":
        client.set_terminated(run_id, status=first["status"], end_time=first["timestamp"])
    elif kind in ("register", "promote"):  # the model registry's calls (the export and evaluate stages')
        from vlmgym.tracking import model_registry

        model_registry.send_entry(client, tracking_uri, first)
    else:
        raise ValueError(f"unknown spool entry kind {kind!r} in {folder / JOURNAL}")


# Client errors a retry cannot fix; an expired credential (401, 403), a timeout (408) and throttling (429) can be.
RETRYABLE_CLIENT_ERRORS = (401, 403, 408, 429)


def refused(err: Exception) -> bool:
    """Whether a failed send is the entry's fault (the server answered 4xx to it, or it cannot be sent at all):
    retrying it would fail forever and hold up what follows. Connection failures and 5xx answers are not."""
    if hasattr(err, "get_http_status_code"):  # MlflowException: its error code as an HTTP status
        status = err.get_http_status_code()
        return 400 <= status < 500 and status not in RETRYABLE_CLIENT_ERRORS
    return isinstance(err, TypeError | ValueError | KeyError | FileNotFoundError)


def send_pending(spool: Spool, client: Any, *, check_first: bool, say: Callable[[str], None] | None = None) -> int:
    """Send the unsent entries in order, recording progress after each call; the number sent. `check_first`:
    entries at the resume point that the server already holds are skipped, not sent twice. An entry the server
    refuses (refused()) is passed over with a warning; any other failure is raised (the caller retries)."""
    sent = 0
    for end, group in _batches(spool.pending()):
        if check_first:
            stored = [e for e in group if _already_stored(client, e)]
            if len(stored) == len(group):
                spool.mark_sent(end)
                continue
            if stored:  # part of a merged group: send the rest alone
                group = [e for e in group if e not in stored]
            check_first = False
        try:
            _send(client, spool.folder, group, spool.tracking_uri)
        except Exception as err:
            if not refused(err):
                raise
            (say or _say)(f"MLflow refused {len(group)} {group[0]['kind']} entr{'y' if len(group) == 1 else 'ies'} "
                          f"of run {group[0]['run_id']} ({type(err).__name__}: {_first_line(err)}): passed over")
        spool.mark_sent(end)
        sent += len(group)
    return sent


def _first_line(err: Exception) -> str:
    return str(err).splitlines()[0][:200] if str(err) else ""


def _say(message: str) -> None:
    print(f"vlmgym: {message}", file=sys.stderr, flush=True)


class Sender:
    """A daemon thread sending one spool as it grows; failures wait and retry, the caller never waits."""

    def __init__(self, spool: Spool, client: Any, say: Callable[[str], None] = _say):
        self.spool, self.client, self.say = spool, client, say
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.outage_since: float | None = None
        self.thread = threading.Thread(target=self._loop, name="vlmgym-mlflow-sender", daemon=True)
        self.thread.start()

    def notify(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        failures, checked, last_reason = 0, False, ""
        while True:
            self._wake.clear()
            try:
                # The first send over a journal a dead process left, and the first after a failure, look up
                # the entries at the resume point first.
                send_pending(self.spool, self.client, check_first=failures > 0 or not checked, say=self.say)
            except Exception as err:  # any client failure: keep the entries, retry later
                failures += 1
                reason = f"{type(err).__name__}: {_first_line(err)}"
                if self.outage_since is None or reason.split(":")[0] != last_reason.split(":")[0]:
                    self.outage_since = self.outage_since or time.monotonic()
                    self.say(f"MLflow ({self.spool.tracking_uri}) failed to take the run's logs ({reason}); the "
                             f"work goes on, the logs wait in {self.spool.folder} and are retried")
                last_reason = reason
                delay = RETRY_DELAYS_S[min(failures - 1, len(RETRY_DELAYS_S) - 1)]
                if self._stop.wait(delay):
                    return
                continue
            if self.outage_since is not None:
                self.say(f"MLflow ({self.spool.tracking_uri}) takes the run's logs again after "
                         f"{time.monotonic() - self.outage_since:.0f} s; nothing was lost")
            failures, checked, self.outage_since = 0, True, None
            if self._stop.is_set() and self.spool.is_sent():
                return
            self._wake.wait(1.0)

    def flush(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for everything appended so far to be sent; whether it was."""
        deadline = time.monotonic() + timeout_s
        self.notify()
        while time.monotonic() < deadline and not self.spool.is_sent():
            time.sleep(0.05)
        return self.spool.is_sent()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, waiting up to timeout_s for a send in flight (whose progress it records) to end."""
        self._stop.set()
        self._wake.set()
        self.thread.join(timeout_s)


def spool_root(store_root: Path) -> Path:
    return store_root / SPOOL_DIR


def run_spool(store_root: Path, run_id: str, tracking_uri: str) -> Spool:
    """The claimed spool of a run (a continued run's holds what its killed process could not send)."""
    spool = Spool(spool_root(store_root) / run_id)
    spool.claim(wait=True)
    spool.set_uri(tracking_uri)
    return spool


def sync(store_root: Path, *, client_for: Callable[[str], Any] | None = None, only_uri: str | None = None,
         say: Callable[[str], None] = _say) -> tuple[int, int]:
    """Send every spool left under store_root (each to the server it was meant for; with `only_uri`, only those
    meant for that one); (spools emptied, left). A spool another live process is sending is left to it."""
    if client_for is None:
        from mlflow.tracking import MlflowClient

        def client_for(uri: str) -> Any:
            return MlflowClient(tracking_uri=uri)

    done = left = 0
    failed: set[str | None] = set()  # servers that failed: their later spools wait, so the order holds
    root = spool_root(store_root)
    # Oldest first: an export's registration goes before the evaluate stage's promotion of the version it makes.
    spools = [Spool(p) for p in root.glob("*") if p.is_dir() and (p / META).exists()] if root.exists() else []
    for spool in sorted(spools, key=lambda s: (s.created() or 0.0, s.folder.name)):
        folder = spool.folder
        if only_uri is not None and spool.tracking_uri != only_uri:
            continue
        if spool.tracking_uri in failed:
            left += 1
            continue
        try:
            spool.claim()
        except SpoolBusy:
            left += 1
            continue
        try:
            sent = send_pending(spool, client_for(spool.tracking_uri), check_first=True, say=say)
        except Exception as err:
            say(f"{folder}: not sent ({type(err).__name__}: {_first_line(err)})")
            failed.add(spool.tracking_uri)
            spool.release()
            left += 1
            continue
        say(f"{folder}: {sent} entries sent to {spool.tracking_uri}")
        spool.remove()
        done += 1
    return done, left


@contextlib.contextmanager
def quick_http(timeout_s: float) -> Iterator[None]:
    """MLflow's HTTP calls inside the block give up after one try of timeout_s (its defaults retry for minutes)."""
    import os

    names = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": f"{max(1, round(timeout_s))}"}
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
