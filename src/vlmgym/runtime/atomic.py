"""Atomic writes: build a file or folder under a temp name beside it, rename it into place only on success.

A reader never sees a half-written output, and a failed write leaves the previous one as it was. Temp names
say who wrote them, so a later cleanup can tell a live writer's temp from one a killed process left behind:

    file:   .{name}.{host}-{pid}.{random}.tmp       (atomic_file)
    folder: .{name}.{host}-{pid}.{random}.partial   (atomic_dir)
    folder: .{name}.{host}-{pid}.{random}.old       (the previous folder, moved aside for the swap)

`host` is this machine's host name with every character outside [A-Za-z0-9_-] replaced by `_` (no dots, so
the name splits on `.`), `pid` the writing process, `random` tempfile's 8 characters of [a-z0-9_].

A finished output gets the mode a plain open() or mkdir() would give it (0666 or 0777 less the umask), not the
private 0600 / 0700 that tempfile gives its temps (nor the 0600 that safetensors' save_file gives its files).

A killed writer's temps are removed by its janitor process as soon as it dies (`vlmgym.runtime.janitor`), and, should
that be lost too, by the next write of the same target, which first removes its temps left by writers that no
longer run; live writers' temps are never touched (`vlmgym.runtime.temps`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vlmgym.runtime import janitor, temps, write_hooks


def writer_tag() -> str:
    """`{host}-{pid}` of this process, as it appears in temp names."""
    return f"{temps.host_tag()}-{os.getpid()}"


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{writer_tag()}."


def _umask() -> int:
    """This process's umask. Read from /proc where Linux shows it; only elsewhere is it set and set back to read it,
    since for that instant files that other threads create (orbax and JAX write from threads) would get its mode."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _give_plain_modes(path: Path) -> None:
    """Give `path`, and everything under it if a folder, the mode a plain open() (files) or mkdir() (folders)
    would: tempfile makes its temps private (0600 files, 0700 folders), and safetensors' save_file writes its
    files 0600 too, but an output is meant to be as readable as every other file written beside it. A file with
    any execute bit keeps being executable (0777 less the umask); setuid/setgid/sticky bits stay;
    links are left alone (chmod would change what they point to)."""
    umask = _umask()

    def give(entry: str | Path) -> None:
        mode = os.lstat(entry).st_mode
        if stat.S_ISLNK(mode):
            return
        plain = 0o777 if stat.S_ISDIR(mode) or mode & 0o111 else 0o666
        os.chmod(entry, (stat.S_IMODE(mode) & 0o7000) | (plain & ~umask))

    give(path)
    if not path.is_symlink() and path.is_dir():
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                give(os.path.join(root, name))


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
        _give_plain_modes(tmp)
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
        _give_plain_modes(tmp)
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
