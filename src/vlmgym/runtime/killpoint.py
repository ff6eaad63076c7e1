"""A test hook that kills this process inside a write, to prove that a killed stage leaves nothing behind.

Set VLMGYM_KILL_IN_WRITE to part of a write's label (the absolute target path of an atomic write, or
`<checkpoint folder>/<step>` of a training save), or to a pattern with `*` matching the whole label (e.g.
`*/checkpoints/sft/*/4`: the save of step 4), and the process SIGKILLs itself at that point: for an atomic
write when the temp is complete but not yet renamed, for a checkpoint while orbax's temp folder for the step
is on disk. Unset (the default), nothing is registered and writes run no hook at all
(`vlmgym.runtime.write_hooks`).
"""

from __future__ import annotations

import fnmatch
import os
import signal
import sys
import threading
import time
from pathlib import Path

from vlmgym.runtime import write_hooks

ENV = "VLMGYM_KILL_IN_WRITE"


def armed(label: str | Path) -> bool:
    """Whether VLMGYM_KILL_IN_WRITE is set and part of `label`."""
    wanted, label = os.environ.get(ENV, ""), Path(label).as_posix()
    if "*" in wanted:
        return fnmatch.fnmatchcase(label, wanted)
    return bool(wanted) and wanted in label


def kill_now(label: str | Path) -> None:
    print(f"[vlmgym] {ENV}: killing pid {os.getpid()} inside the write of {label}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_if_armed(label: str | Path) -> None:
    if armed(label):
        kill_now(label)


def kill_in_checkpoint_save(folder: Path, step: int, temp_glob: str, poll_s: float = 0.0005) -> None:
    """If armed for `<folder>/<step>`: kill this process as soon as `folder` holds an entry matching `temp_glob`
    (orbax writes the step under a temp name that no hook of ours reaches)."""
    label = folder / str(step)
    if not armed(label):
        return

    def watch() -> None:
        while not any(folder.glob(temp_glob)):
            time.sleep(poll_s)
        kill_now(label)

    threading.Thread(target=watch, daemon=True, name="vlmgym-killpoint").start()


def install_if_set() -> None:
    """Register the hooks when VLMGYM_KILL_IN_WRITE is set (once, as vlmgym.runtime is imported)."""
    if os.environ.get(ENV) and kill_if_armed not in write_hooks.before_rename:
        write_hooks.before_rename.append(kill_if_armed)
        write_hooks.at_checkpoint_save.append(kill_in_checkpoint_save)
