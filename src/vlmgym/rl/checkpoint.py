"""Training checkpoints with exact resume: params, optimizer state, RNG key and loop state under orbax.

Each checkpoint is one orbax step directory holding three items:
- `params` and `opt_state`: array pytrees (restored with the shapes, dtypes and shardings of templates),
- `loop`: JSON with the step, the RNG key's raw data, the data cursor and any other loop state.
Orbax writes a step into `<step>.orbax-checkpoint-tmp*` and renames it only when every item is on disk,
so a run killed mid-save leaves no step that looks complete; `latest_step` only sees finalised steps and
leftover temporary directories are removed when the manager opens the directory again (tested by killing a
save: tests/rl/test_checkpoint.py and the kill-and-rerun pipeline test).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from vlmgym.runtime import distributed, janitor, temps, write_hooks

# Orbax writes step N into `N.orbax-checkpoint-tmp*` and renames it when every item is on disk.
ORBAX_TEMP_GLOB = "*.orbax-checkpoint-tmp*"


class CheckpointDamaged(ValueError):
    """None of the checkpoints in a run's folder can be restored (the message names the folder to delete)."""

    user_error = True  # the stages print its message as one line (vlmgym.runtime.errors)


@dataclass
class Restored:
    """What a checkpoint gives back."""

    step: int
    params: Any
    opt_state: Any
    rng: jax.Array
    loop_state: dict


def _abstract(tree: Any) -> Any:
    """Shape/dtype/sharding placeholders of a pytree, so restore reproduces its layout."""
    def leaf(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x
    return jax.tree.map(leaf, tree)


def _key_to_json(key: jax.Array) -> dict:
    """A JAX PRNG key (typed or raw uint32) as JSON-safe data."""
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return {"typed": True, "impl": str(jax.random.key_impl(key)),
                "data": np.asarray(jax.random.key_data(key)).tolist()}
    return {"typed": False, "data": np.asarray(key).tolist()}


def _key_from_json(data: dict) -> jax.Array:
    raw = np.asarray(data["data"], dtype=np.uint32)
    if data["typed"]:
        return jax.random.wrap_key_data(raw, impl=data["impl"])
    return jax.numpy.asarray(raw)


def _brief(err: BaseException) -> str:
    """An exception as one short line: its root cause's first line (orbax wraps tensorstore's plain "Requested byte
    range ... is not valid for value of size 1000" in many lines of specs)."""
    while (err.__cause__ or err.__context__) is not None:
        err = err.__cause__ or err.__context__
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    text = text.split(" See full TensorStore details")[0]
    text = text if len(text) <= 240 else text[:237] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def remove_unfinished_saves(directory: Path) -> None:
    """Remove orbax's temp step folders that a killed save left (one manager per folder at a time).

    Orbax's own `cleanup_tmp_directories` runs in a background thread that nothing waits for, so a process
    that exits soon after opening the folder can leave them in place (measured: 2 of 6 reopenings)."""
    for stale in sorted(directory.glob(ORBAX_TEMP_GLOB)):
        size = temps.disk_size(stale)
        shutil.rmtree(stale, ignore_errors=True)
        print(f"vlmgym: removed {stale} ({temps.human_size(size)}), a checkpoint save that never finished",
              file=sys.stderr, flush=True)


class CheckpointManager:
    """Save every `save_every` steps keeping the newest `keep`, and resume from the latest one."""

    def __init__(self, directory: str | Path, save_every: int, keep: int, async_save: bool = False):
        if save_every < 1 or keep < 1:
            raise ValueError(f"save_every={save_every} and keep={keep} must both be >= 1")
        self.directory = Path(directory).absolute()
        self.save_every = save_every
        if distributed.is_primary():  # in a run over several processes, one of them clears the shared folder
            remove_unfinished_saves(self.directory)
        distributed.barrier(f"vlmgym-checkpoints-open:{self.directory}")
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=save_every,
            max_to_keep=keep,
            create=True,
            # A run killed during a save leaves a temporary directory behind: clear it on the next start.
            cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save,
        )
        handlers = {"params": ocp.StandardCheckpointHandler(), "opt_state": ocp.StandardCheckpointHandler(),
                    "loop": ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of all complete checkpoints kept on disk, ascending."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, params: Any, opt_state: Any, rng: jax.Array, loop_state: dict | None = None,
             force: bool = False) -> bool:
        """Save at `step` if it is a multiple of save_every (or force). Returns whether it saved."""
        if not force and step % self.save_every:
            return False
        loop = {"step": int(step), "rng": _key_to_json(rng), "state": loop_state or {}}
        for hook in write_hooks.at_checkpoint_save:
            hook(self.directory, step, ORBAX_TEMP_GLOB)
        unfinished = str(self.directory / f"{step}{ORBAX_TEMP_GLOB[1:]}")
        janitor.track_glob(unfinished)  # removed at once if this process dies inside the save
        # The interval decision is made above (orbax would also save the first step it sees).
        saved = self._manager.save(
            step,
            args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                    opt_state=ocp.args.StandardSave(opt_state),
                                    loop=ocp.args.JsonSave(loop)),
            force=True,
        )
        janitor.untrack_glob(unfinished)
        return saved

    def restore(self, params_template: Any, opt_state_template: Any, step: int | None = None) -> Restored:
        """Restore `step` (default: latest) with the shapes, dtypes and shardings of the templates."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no complete checkpoint to restore")
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(params=ocp.args.StandardRestore(_abstract(params_template)),
                                    opt_state=ocp.args.StandardRestore(_abstract(opt_state_template)),
                                    loop=ocp.args.JsonRestore()),
        )
        loop = restored["loop"]
        if loop["step"] != step:
            raise ValueError(f"{self.directory}/{step}: loop state records step {loop['step']}, expected {step}")
        return Restored(step=step, params=restored["params"], opt_state=restored["opt_state"],
                        rng=_key_from_json(loop["rng"]), loop_state=loop["state"])

    def restore_latest(self, params_template: Any, opt_state_template: Any) -> Restored | None:
        """Restore the newest checkpoint that restores, None when the folder holds none.

        A newer one that fails (a file cut short or corrupted on disk) is reported on stderr, one line each, and
        removed once an older one restores: the resumed run saves those steps again. When none restores, raise
        CheckpointDamaged naming the folder to delete (nothing is removed then: a failure common to every
        checkpoint may not be damage)."""
        failures: list[tuple[int, Exception]] = []
        for step in reversed(self.all_steps()):
            try:
                restored = self.restore(params_template, opt_state_template, step)
            except Exception as err:  # noqa: BLE001 (orbax and tensorstore raise many kinds for a damaged file)
                failures.append((step, err))
                continue
            for bad, err in failures:
                self._manager.delete(bad)
                print(f"vlmgym: warning: checkpoint {self.directory / str(bad)} cannot be restored ({_brief(err)}); "
                      f"removed it, resuming from step {step}", file=sys.stderr, flush=True)
            return restored
        if failures:
            step, err = failures[0]
            raise CheckpointDamaged(f"{self.directory}: none of its checkpoints (steps "
                                    f"{', '.join(str(s) for s, _ in failures)}) can be restored (step "
                                    f"{step}: {_brief(err)}); delete that folder to run this stage again from step 0")
        return None

    def wait(self) -> None:
        """Block until any asynchronous save has finished."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
