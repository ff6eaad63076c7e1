"""Several processes, one training run: JAX's multi-controller runtime (`jax.distributed`) for the train stage.

Every process runs the same program over one device mesh that spans all processes' devices. What each holds:
- the step's global prompt order is the same everywhere (one seeded permutation of the train split); process i
  resets, decodes and samples only its contiguous share of the step's prompts (`local_range`), so a group of
  completions stays on one process and the samples a run draws do not depend on how many processes share it;
- what the processes sampled and scored (tokens, log-probs, rewards, texts) and the prompts they encoded are
  gathered (`gather_rows`, `gather_json`), so advantages, metrics and the global learner batch are the same
  on every process; the batch goes onto the mesh with `put_global` and the update is one jitted program;
- checkpoints and model folders are written by all processes together with orbax into a folder they all see
  (`shared_dir`); MLflow and the DVC metrics files by process 0 only (`is_primary`).

Settings (standard JAX names, or the train stage's flags): JAX_COORDINATOR_ADDRESS (host:port of process 0),
JAX_NUM_PROCESSES, JAX_PROCESS_ID; VLMGYM_HEARTBEAT_TIMEOUT_S (how soon the others give up on a dead process).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

COORDINATOR_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"
HEARTBEAT_ENV = "VLMGYM_HEARTBEAT_TIMEOUT_S"
DEFAULT_HEARTBEAT_S = 60


@dataclass(frozen=True)
class Settings:
    """Where process `process_id` of `num_processes` finds the coordinator (process 0's host:port)."""

    coordinator: str
    num_processes: int
    process_id: int
    heartbeat_timeout_s: int = DEFAULT_HEARTBEAT_S

    def __post_init__(self) -> None:
        if self.num_processes < 1 or not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"process id {self.process_id} of {self.num_processes} processes: expected "
                             f"0 <= id < count")
        if self.num_processes > 1 and ":" not in self.coordinator:
            raise ValueError(f"coordinator address {self.coordinator!r}: expected host:port (process 0's)")


def settings_from(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
                  environ: dict | None = None) -> Settings | None:
    """The run's settings from explicit values, else the environment; None for a plain single-process run."""
    environ = os.environ if environ is None else environ

    def number(value: Any, name: str) -> int | None:
        if value is None or value == "":
            return None
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name}={value!r}: expected an integer") from None

    coordinator = coordinator or environ.get(COORDINATOR_ENV) or None
    count = num_processes if num_processes is not None else number(environ.get(NUM_PROCESSES_ENV), NUM_PROCESSES_ENV)
    index = process_id if process_id is not None else number(environ.get(PROCESS_ID_ENV), PROCESS_ID_ENV)
    given = {COORDINATOR_ENV: coordinator, NUM_PROCESSES_ENV: count, PROCESS_ID_ENV: index}
    if all(v is None for v in given.values()) or count == 1:
        return None
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise ValueError(f"a multi-process run needs {', '.join(given)}; missing: {', '.join(missing)}")
    heartbeat = number(environ.get(HEARTBEAT_ENV), HEARTBEAT_ENV) or DEFAULT_HEARTBEAT_S
    return Settings(coordinator, count, index, heartbeat)


def initialize(settings: Settings | None) -> None:
    """Join the run's processes (nothing for a single-process run). Call before any other JAX work."""
    if settings is None:
        return
    if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS", "") == "cpu":
        # CPU devices talk over gloo (TCP); accelerators bring their own collectives.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=settings.coordinator, num_processes=settings.num_processes,
                               process_id=settings.process_id, heartbeat_timeout_seconds=settings.heartbeat_timeout_s,
                               initialization_timeout=max(60, 2 * settings.heartbeat_timeout_s))
    print(f"vlmgym: process {jax.process_index()} of {jax.process_count()} joined {settings.coordinator} "
          f"({jax.local_device_count()} local of {jax.device_count()} devices)", file=sys.stderr, flush=True)


def count() -> int:
    return jax.process_count()


def index() -> int:
    return jax.process_index()


def is_primary() -> bool:
    """Process 0: the one that logs to MLflow and writes the small metrics files."""
    return jax.process_index() == 0


def local_range(total: int) -> tuple[int, int]:
    """This process's contiguous share [start, stop) of `total` items (equal shares: total must divide)."""
    processes = jax.process_count()
    if total % processes:
        raise ValueError(f"{total} items do not split evenly over {processes} processes")
    share = total // processes
    return jax.process_index() * share, (jax.process_index() + 1) * share


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier `name` (nothing in a single-process run)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _allgather(array: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    # stacked: [processes, *shape], the same on every process
    return np.asarray(multihost_utils.process_allgather(array, tiled=False))


def gather_rows(array: np.ndarray) -> np.ndarray:
    """Each process's rows (any count, the same trailing shape and dtype), concatenated in process order."""
    array = np.asarray(array)
    if jax.process_count() == 1:
        return array
    # As raw bytes: JAX would narrow 64-bit values to 32 bits (x64 is off).
    trailing = array.shape[1:]
    raw = np.ascontiguousarray(array).reshape(array.shape[0], -1).view(np.uint8) if array.size else np.zeros(
        (array.shape[0], int(np.prod(trailing, dtype=np.int64)) * array.dtype.itemsize), np.uint8)
    counts = [int(c) for c in _allgather(np.asarray([raw.shape[0]], np.int32))[:, 0]]
    padded = np.zeros((max(counts), raw.shape[1]), np.uint8)
    padded[: raw.shape[0]] = raw
    stacked = _allgather(padded)
    rows = np.concatenate([stacked[p, : counts[p]] for p in range(len(counts))])
    return np.ascontiguousarray(rows).view(array.dtype).reshape(len(rows), *trailing)


def gather_json(value: Any) -> list[Any]:
    """Every process's JSON-able `value`, in process order (as JSON: no pickle crosses processes)."""
    if jax.process_count() == 1:
        return [value]
    data = np.frombuffer(json.dumps(value, default=_plain).encode(), np.uint8)
    counts = _allgather(np.asarray([data.size], np.int32))[:, 0]
    padded = np.zeros(int(counts.max()), np.uint8)
    padded[: data.size] = data
    stacked = _allgather(padded)
    return [json.loads(stacked[p, : counts[p]].tobytes().decode()) for p in range(len(counts))]


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as the Python values JSON holds (exactly, for float32 and float64)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON data")


def put_global(tree: Any, shardings: Any) -> Any:
    """Host arrays (the same global value on every process) as global jax.Arrays with `shardings`; each process
    places only the pieces its own devices hold."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def put(value: Any, sharding: Any) -> jax.Array:
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda where: value[where])

    return jax.tree.map(put, tree, shardings)


def host_value(array: Any) -> np.ndarray:
    """A (possibly multi-process) jax.Array's whole value on this host."""
    if not isinstance(array, jax.Array) or array.is_fully_addressable or array.is_fully_replicated:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


@functools.cache
def _replicator(mesh: Any) -> Any:
    """One jitted copy-to-every-device per mesh (a fresh lambda per call would compile on every sampling step)."""
    return jax.jit(lambda tree: tree, out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def local_copy(tree: Any) -> Any:
    """Params spread over the processes' mesh as single-device arrays on this process's first device (what the
    rollout engine samples with on its own); a single-process tree passes through."""
    leaves = jax.tree.leaves(tree)
    if jax.process_count() == 1 or not leaves or all(
            not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
        return tree
    if not all(x.is_fully_replicated for x in leaves if isinstance(x, jax.Array)):
        tree = _replicator(next(x.sharding.mesh for x in leaves if isinstance(x, jax.Array)
                                and hasattr(x.sharding, "mesh")))(tree)
    return jax.tree.map(lambda x: x.addressable_data(0) if isinstance(x, jax.Array) else x, tree)


@contextlib.contextmanager
def shared_dir(final: str | Path) -> Iterator[Path]:
    """atomic.atomic_dir for all processes at once: one temp folder beside `final` that every process writes
    into (orbax saves a global array collectively), renamed over `final` by process 0 once all are done. The
    folder must be on a filesystem every process sees (the same path on each host)."""
    final = Path(final).absolute()
    tmp = final.with_name(f".{final.name}.multiprocess-partial")
    if is_primary():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(f"vlmgym-shared-dir-open:{final}")
    yield tmp
    barrier(f"vlmgym-shared-dir-written:{final}")
    if is_primary():
        old = final.with_name(f".{final.name}.multiprocess-old")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    barrier(f"vlmgym-shared-dir-done:{final}")


@contextlib.contextmanager
def exit_together(what: str) -> Iterator[None]:
    """In a run over several processes, any error here (this process's own, or a collective that failed because
    another process died) ends this process at once with a message that says what to do. Without it the process
    would hang in JAX's shutdown barrier waiting for the dead one, then abort."""
    try:
        yield
    except BaseException as error:
        if jax.process_count() == 1:
            raise
        import traceback

        traceback.print_exc()
        print(f"vlmgym: {what}: process {jax.process_index()} of {jax.process_count()} stopped: "
              f"{type(error).__name__}: {error}\nvlmgym: when one process of a run fails or dies, all of them stop "
              "(a collective with a dead process fails; JAX's heartbeat check ends the rest); start every process "
              "again and the run resumes from its last complete checkpoint", file=sys.stderr, flush=True)
        os._exit(1)
