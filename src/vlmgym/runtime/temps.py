"""Temp outputs left by killed writers: find them by name, tell live writers from dead ones, remove the dead.

Every temp that `vlmgym.runtime.atomic` creates is named after its target and its writer:

    .{target}.{host}-{pid}.{random}.{tmp|partial|old}

A temp whose writer ran on this host and no longer runs (its pid is gone, or was reused by a process started
after the temp was last written) can never be finished or renamed by anyone: it is removed. A temp of a live
writer, or of a writer on another host (a shared disk; its pid means nothing here), is never touched.

    vlmgym clean-temps [--dry-run] [ROOT ...]    # default roots: data models outputs reports metrics checkpoints
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# The folders the pipeline writes into (relative to the repository root).
OUTPUT_ROOTS = ("data", "models", "outputs", "reports", "metrics", "checkpoints")
SUFFIXES = ("tmp", "partial", "old")
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.[a-z0-9_]+\."
                        r"(?P<kind>tmp|partial|old)$")
# The kernel's initial pid namespace (PROC_PID_INIT_INO): a host's processes outside any container.
_INITIAL_PID_NAMESPACE = "4026531836"
# A live writer's temp is written after its process started; allow for /proc's whole-second boot time.
_START_SLACK_S = 2.0


def host_tag() -> str:
    """Where pids mean what they mean here, as it appears in temp names (no dots, so names split on `.`): the
    host name, plus the pid namespace where it is not the host's first one (two containers may share a host
    name, never a pid namespace)."""
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return host
    inode = re.sub(r"\D", "", namespace)
    return host if inode == _INITIAL_PID_NAMESPACE else f"{host}_ns{inode}"


@dataclass(frozen=True)
class Temp:
    """One temp file or folder named by `vlmgym.runtime.atomic`."""

    path: Path
    target: str
    host: str
    pid: int


def parse_temp(path: Path) -> Temp | None:
    """The temp's target and writer, or None when `path` is not named like a vlmgym temp."""
    match = _TEMP_NAME.match(path.name)
    if match is None:
        return None
    return Temp(path, match["target"], match["host"], int(match["pid"]))


def _process_start(pid: int) -> float | None:
    """When process `pid` started (epoch seconds), from Linux /proc; None where that cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    ticks = float(stat[stat.rindex(")") + 2:].split()[19])  # field 22; the name in field 2 may hold spaces
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def process_state(host: str, pid: int, since: float) -> str:
    """Whether the process `{host}-{pid}` that was running at time `since` (epoch seconds) still runs: 'live',
    'dead', or 'elsewhere' (another host or container: its pid cannot be checked from here)."""
    if host != host_tag():
        return "elsewhere"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead"
    except PermissionError:
        pass  # another user's live process
    started = _process_start(pid)
    if started is not None and started > since + _START_SLACK_S:
        return "dead"  # the pid now belongs to a younger process
    return "live"


def writer_state(temp: Temp) -> str:
    """'live', 'dead' or 'elsewhere' for the writer named in a temp (its writer ran when it was last written)."""
    try:
        written = temp.path.lstat().st_mtime
    except FileNotFoundError:
        return "live"  # its writer just renamed or removed it
    return process_state(temp.host, temp.pid, since=written)


def disk_size(path: Path) -> int:
    """Bytes under `path` (a file or a folder tree; links not followed)."""
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # removed while we walk
                total += (Path(folder) / name).lstat().st_size
    return total


def human_size(n: float) -> str:
    units = ("B", "KB", "MB", "GB", "TB")
    i = 0
    while n >= 1000 and i < len(units) - 1:
        n, i = n / 1000, i + 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


def _remove(temp: Temp, dry_run: bool, log) -> int:
    try:
        size = disk_size(temp.path)
    except FileNotFoundError:
        return 0
    verb = "would remove" if dry_run else "removed"
    if not dry_run:
        if temp.path.is_dir() and not temp.path.is_symlink():
            shutil.rmtree(temp.path, ignore_errors=True)
        else:
            temp.path.unlink(missing_ok=True)
    log(f"vlmgym: {verb} stale temp {temp.path} ({human_size(size)}), left by {temp.host}-{temp.pid} "
        "which no longer runs")
    return size


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def remove_stale(temps: Iterable[Temp], dry_run: bool = False, log=_stderr) -> tuple[int, int]:
    """Remove the temps whose writer is dead; returns (how many, bytes)."""
    count = size = 0
    for temp in temps:
        if writer_state(temp) == "dead":
            size += _remove(temp, dry_run, log)
            count += 1
    return count, size


def sibling_temps(target: str | Path) -> list[Temp]:
    """The vlmgym temps of `target` in its folder (of any writer)."""
    target = Path(target)
    if not target.parent.is_dir():
        return []
    found = (parse_temp(p) for p in target.parent.glob(f".{glob_escape(target.name)}.*"))
    return [t for t in found if t is not None and t.target == target.name]


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def temps_under(roots: Iterable[str | Path]) -> Iterator[Temp]:
    """Every vlmgym temp under the roots (not inside other temps)."""
    for root in map(Path, roots):
        if not root.is_dir():
            continue
        for folder, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                temp = parse_temp(Path(folder) / name)
                if temp is not None:
                    yield temp
                    if name in dirs:
                        dirs.remove(name)


def sweep(roots: Iterable[str | Path] = OUTPUT_ROOTS, dry_run: bool = False, log=_stderr) -> tuple[int, int]:
    """Remove every dead writer's temp under the roots; returns (how many, bytes)."""
    return remove_stale(list(temps_under(roots)), dry_run=dry_run, log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vlmgym clean-temps", description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", default=list(OUTPUT_ROOTS),
                        help=f"folders to search (default: {' '.join(OUTPUT_ROOTS)})")
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    temps = list(temps_under(args.roots))
    count, size = remove_stale(temps, dry_run=args.dry_run, log=print)
    kept = len(temps) - count
    print(f"clean-temps: {'would remove' if args.dry_run else 'removed'} {count} stale temp(s), "
          f"{human_size(size)}; {kept} of live writers or other hosts left alone "
          f"({time.perf_counter() - started:.1f} s)")
    return 0
