"""Atomic writes: build a file or folder under a temp name beside it, rename it into place only on success.

A reader never sees a half-written output, and a failed write leaves the previous one as it was. Temp names
say who wrote them, so a later cleanup can tell a live writer's temp from one a killed process left behind:

    file:   .{name}.{host}-{pid}.{random}.tmp       (atomic_file)
    folder: .{name}.{host}-{pid}.{random}.partial   (atomic_dir)
    folder: .{name}.{host}-{pid}.{random}.old       (the previous folder, moved aside for the swap)

`host` is this machine's host name with every character outside [A-Za-z0-9_-] replaced by `_` (no dots, so
the name splits on `.`), `pid` the writing process, `random` tempfile's 8 characters of [a-z0-9_].
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path


def writer_tag() -> str:
    """`{host}-{pid}` of this process, as it appears in temp names."""
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
    return f"{host}-{os.getpid()}"


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{writer_tag()}."


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path` (an empty file); it is renamed onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temp folder beside `path`; it replaces `path` (old folder swapped out) only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.partial"):
        shutil.rmtree(stale, ignore_errors=True)  # left by an interrupted earlier run
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".partial", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = tmp.with_suffix(".old")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temp file and a rename."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
