"""A watcher process that removes a writer's unfinished temps the moment the writer dies, even by SIGKILL.

A process that writes through `vlmgym.runtime.atomic` starts one janitor (`python -m vlmgym.runtime.janitor`, in its own
session so that killing the writer's process group spares it) and tells it over a pipe which temps are in
flight: `+path` when one is created, `-path` once it is renamed into place or removed. The pipe closes when the
writer (and every child it forked) exits, however it exits; the janitor then removes what is still in flight.
This is what cleans up after a stage killed under `dvc repro` when DVC then restores that stage from its
run-cache instead of running it again (no vlmgym code runs then). A lost janitor (the machine went down) is
covered by the name-based cleanup in `vlmgym.runtime.temps`.

Lines are `+` or `-`, then a path, or `glob:` and a pattern for temps named by another library (orbax's).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

_lock = threading.Lock()
_pipe: int | None = None  # the write end; -1 when no janitor could be started


def _start() -> int | None:
    """The write end of this process's janitor pipe (started on first use; a forked child shares its parent's)."""
    global _pipe
    with _lock:
        if _pipe is None:
            src = str(Path(__file__).resolve().parents[1])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
            try:
                process = subprocess.Popen([sys.executable, "-m", "vlmgym.runtime.janitor"], stdin=subprocess.PIPE,
                                           start_new_session=True, env=env, close_fds=True)
            except OSError as err:  # no janitor: the name-based cleanup still removes the temps later
                print(f"vlmgym: no temp janitor ({err})", file=sys.stderr)
                _pipe = -1
                return None
            fd = os.dup(process.stdin.fileno())  # not inherited by exec'd children; forked ones share it
            process.stdin.close()
            # It is meant to outlive us (init reaps it): marked done so Popen's destructor does not warn.
            process.returncode = 0
            _pipe = fd
        return _pipe if _pipe >= 0 else None


def _send(op: str, path: str) -> None:
    fd = _start()
    if fd is not None:
        line = f"{op}{path}\n".encode()
        with _lock:
            os.write(fd, line)  # one write of < PIPE_BUF bytes: lines from several threads never interleave


def track(path: str | Path) -> None:
    """An unfinished temp: removed by the janitor if this process dies before `untrack`."""
    _send("+", str(Path(path).absolute()))


def untrack(path: str | Path) -> None:
    _send("-", str(Path(path).absolute()))


def track_glob(pattern: str) -> None:
    _send("+", f"glob:{pattern}")


def untrack_glob(pattern: str) -> None:
    _send("-", f"glob:{pattern}")


def _remove(path: Path) -> None:
    try:
        from vlmgym.runtime.temps import disk_size, human_size

        size = human_size(disk_size(path))
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except FileNotFoundError:
        return
    print(f"vlmgym: removed {path} ({size}): its writer died before finishing it", file=sys.stderr, flush=True)


def main() -> int:
    pending: dict[str, None] = {}
    for raw in sys.stdin.buffer:
        line = raw.decode(errors="replace").rstrip("\n")
        if line[:1] == "+":
            pending[line[1:]] = None
        elif line[:1] == "-":
            pending.pop(line[1:], None)
    for entry in pending:  # EOF: every process that held the pipe is gone
        paths = glob.glob(entry[5:]) if entry.startswith("glob:") else [entry]
        for path in sorted(paths):
            _remove(Path(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
