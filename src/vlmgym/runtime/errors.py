"""One line for a user's error: what went wrong, where (the file, key or path) and the fix; exit status 2.

Every stage script ends with `sys.exit(guarded("<stage>", main))`, and the `vlmgym` command runs its subcommands
through `guarded` too. A user error is one the user fixes without touching the code: a params value
(ParamsError), a YAML syntax error (file, line, column), a missing or unreadable path, a full disk, an MLflow
server that does not answer, or any exception whose class subclasses UserError or sets the class attribute
`user_error = True` (how a library module marks its own errors without importing this one). Anything else is a
bug and keeps its traceback. `VLMGYM_DEBUG=1` prints the traceback of a user error too, before its line.

Stdlib only, and the classes it recognises are looked up in sys.modules (an error of a module that was never
imported cannot be raised), so a stage's start pays nothing for it.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

DEBUG_ENV = "VLMGYM_DEBUG"
USER_ERROR_STATUS = 2
NO_SPACE_TEXT = "no space left on device"
# Texts of a connection that failed, as requests, urllib3 and MLflow's REST client word them.
UNREACHABLE_TEXTS = ("max retries exceeded", "failed to establish a new connection", "connection refused",
                     "connectionerror", "remotedisconnected", "connection aborted")


class UserError(Exception):
    """An error the user fixes (a param, a file, the disk, a server); its message is the whole line: say what,
    where and the fix."""

    user_error = True


def _chain(err: BaseException) -> Iterator[BaseException]:
    """The error, what caused it, the errors it was raised while handling, and an exception group's members."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        todo += list(getattr(current, "exceptions", ()) or ())


def _loaded(module: str, name: str) -> type | None:
    cls = getattr(sys.modules.get(module), name, None)
    return cls if isinstance(cls, type) else None


def _where(path: Any) -> str:
    """A path as the user would type it: relative to the working directory when under it."""
    path = Path(os.fsdecode(path))
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def _path_in_frames(tb: TracebackType | None) -> str | None:
    """The innermost path-like local of the traceback's frames (the file a failed write was writing: an OSError
    raised by write() names no file)."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, os.PathLike) or (isinstance(value, str) and os.sep in value and "\n" not in value
                                                   and len(value) < 4096):
                candidate = Path(os.fspath(value))
                if candidate.exists() or candidate.parent.is_dir():
                    return os.fspath(candidate)
    return None


def _free_space(path: str) -> str:
    folder = Path(path).resolve()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return f"{shutil.disk_usage(folder).free / 2**20:.0f} MiB free"
    except OSError:
        return "free space unknown"


def _no_space(err: BaseException, stage: str) -> str | None:
    full = [e for e in _chain(err) if (isinstance(e, OSError) and e.errno == errno.ENOSPC)
            or NO_SPACE_TEXT in str(e).lower()]
    if not full:
        return None
    named = next((e.filename for e in full if isinstance(e, OSError) and e.filename), None)
    path = named or next((p for e in _chain(err) if (p := _path_in_frames(e.__traceback__))), None) or os.getcwd()
    setting = f"{stage}.checkpointing.dir" if stage in ("sft", "train") else "the outputs (or checkpointing.dir)"
    return (f"no space left on device under {_where(path)} ({_free_space(path)}): free space on that disk, or move "
            f"{setting} to a larger one, then run the stage again")


def _missing_path(err: BaseException) -> str | None:
    if isinstance(err, FileNotFoundError | NotADirectoryError):
        if not err.filename:
            return str(err)  # a message of our own, which names the path and the fix
        return (f"no such file or directory: {_where(err.filename)}: run the stage that writes it (`dvc repro`), or "
                "fix the path in params.yaml")
    if isinstance(err, PermissionError):
        if not err.filename:
            return str(err)
        return (f"permission denied: {_where(err.filename)}: make it readable and writable by this user, or point "
                "params.yaml at another path")
    return None


def _params(err: BaseException) -> str | None:
    params_error = _loaded("vlmgym.config.spec", "ParamsError")
    if params_error is None or not isinstance(err, params_error):
        return None
    if str(err).endswith("params file not found"):
        return f"{err}: pass --params an existing file"
    return f"{err}: fix the value in the params file (or the `dvc exp run -S` override) and run again"


def _yaml(err: BaseException) -> str | None:
    yaml_error = _loaded("yaml", "YAMLError")
    if yaml_error is None or not isinstance(err, yaml_error):
        return None
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    # A stream read from bytes is named "<byte string>": the file is then the reader's path argument.
    name = getattr(mark, "name", "") or "<>"
    if name.startswith("<"):
        name = _path_in_frames(err.__traceback__) or "the YAML file"
    if mark is None:
        return f"{_where(name)}: invalid YAML ({problem}): fix the file's syntax"
    # the mark counts from 0; editors count lines and columns from 1
    return (f"{_where(name)}, line {mark.line + 1}, column {mark.column + 1}: invalid YAML ({problem}): fix "
            "the syntax there")


def _tracking_uri() -> str:
    mlflow = sys.modules.get("mlflow")
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    try:
        return mlflow.get_tracking_uri() if mlflow is not None else "the MLflow tracking server"
    except Exception:
        return "the MLflow tracking server"


def _unreachable(err: BaseException) -> str | None:
    for e in _chain(err):
        module = type(e).__module__ or ""
        text = f"{type(e).__name__} {e}".lower()
        if module.split(".")[0] in ("mlflow", "requests", "urllib3") and any(t in text for t in UNREACHABLE_TEXTS):
            # the socket's own words ("[Errno 111] Connection refused") say it best; MLflow's message is a paragraph
            found = re.search(r"\[Errno -?\d+\] [^'\")\]]+", str(e))
            reason = found.group(0).strip() if found else type(e).__name__
            return (f"the MLflow tracking server {_tracking_uri()} did not answer ({reason}): start it and run "
                    "again (logs already taken wait in mlflow-spool/: `vlmgym tracking sync`), or unset "
                    "MLFLOW_TRACKING_URI and tracking.tracking_uri to log to the local store (mlflow.db)")
    return None


def _marked(err: BaseException) -> str | None:
    if getattr(type(err), "user_error", False):
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return None


def user_error_line(err: BaseException, what: str) -> str | None:
    """The one line for `err` when it is a user error (module docstring), prefixed by `what` (the stage or
    command); None for a bug."""
    for describe in (_marked, _params, _yaml, lambda e: _no_space(e, what), _missing_path, _unreachable):
        detail = describe(err)
        if detail:
            return f"{what}: error: {' '.join(detail.split())}"
    return None


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def guarded(what: str, main: Callable[..., Any], *args: Any) -> int:
    """main(*args) as an exit status: a user error becomes its one line on stderr and status 2 (with the
    traceback too under VLMGYM_DEBUG=1); any other exception propagates with its traceback."""
    try:
        return int(main(*args) or 0)
    except Exception as err:
        line = user_error_line(err, what)
        if line is None:
            raise
        if debugging():
            traceback.print_exc()
        print(line, file=sys.stderr, flush=True)
        return USER_ERROR_STATUS
