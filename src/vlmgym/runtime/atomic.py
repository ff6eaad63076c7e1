"""Atomic writes: build a file or folder under a temp name beside it, rename it into place only on success.

A reader never sees a half-written output, and a failed write leaves the previous one as it was. Temp names
say who wrote them, so a later cleanup can tell a live writer's temp from one a killed process left behind:

    file:   .{name}.{host}-{pid}.{random}.tmp       (atomic_file)
    folder: .{name}.{host}-{pid}.{random}.partial   (atomic_dir)
    folder: .{name}.{host}-{pid}.{random}.old       (the previous folder, moved aside for the swap)

`host` is this machine's host name with every character outside [A-Za-z0-9_-] replaced by `_` (no dots, so
the name splits on `.`), `pid` the writing process, `random` tempfile's 8 characters of [a-z0-9_].

A killed writer's temps are removed by its janitor process as soon as it dies (`vlmgym.runtime.janitor`), and, should
that be lost too, by the next write of the same target, which first removes its temps left by writers that no
longer run; live writers' temps are never touched (`vlmgym.runtime.temps`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vlmgym.runtime import janitor, temps, write_hooks


def writer_tag() -> str:
    """`{host}-{pid}` of this process, as it appears in temp names."""
    return f"{temps.host_tag()}-{os.getpid()}"


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{writer_tag()}."


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path` (an empty file); it is renamed onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temps.remove_stale(temps.sibling_temps(path))
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    janitor.track(tmp)
    try:
        yield tmp
        for hook in write_hooks.before_rename:
            hook(path.absolute())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        janitor.untrack(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temp folder beside `path`; it replaces `path` (old folder swapped out) only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temps.remove_stale(temps.sibling_temps(path))
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".partial", dir=path.parent))
    old = tmp.with_suffix(".old")
    janitor.track(tmp)
    try:
        yield tmp
        for hook in write_hooks.before_rename:
            hook(path.absolute())
        if path.exists():
            janitor.track(old)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
        janitor.untrack(tmp)
        janitor.untrack(old)


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temp file and a rename."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
