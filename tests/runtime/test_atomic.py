"""Atomic writes: the target changes only when the block succeeds, temps never stay, temp names carry the writer."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from vlmgym.runtime import killpoint, temps, write_hooks
from vlmgym.runtime.atomic import atomic_dir, atomic_file, write_text_atomically, writer_tag


def test_writer_tag_is_host_and_pid_without_dots():
    host, pid = writer_tag().rsplit("-", 1)
    assert int(pid) == os.getpid() and "." not in host and host
    if all(c.isalnum() or c in "_-" for c in socket.gethostname()):
        # Inside a container the pid namespace is added: a pid is only meaningful within it.
        namespace = os.readlink("/proc/self/ns/pid").strip("pid:[]") if os.path.exists("/proc/self/ns/pid") else ""
        assert host in (socket.gethostname(), f"{socket.gethostname()}_ns{namespace}")


def test_atomic_file_names_its_temp_after_the_writer_and_renames_it(tmp_path):
    target = tmp_path / "sub" / "metrics.json"
    with atomic_file(target) as tmp:
        assert tmp.parent == target.parent and tmp.exists() and not target.exists()
        assert tmp.name.startswith(f".metrics.json.{writer_tag()}.") and tmp.name.endswith(".tmp")
        tmp.write_text("new")
    assert target.read_text() == "new" and sorted(p.name for p in target.parent.iterdir()) == ["metrics.json"]


def test_failed_file_write_keeps_the_old_content_and_removes_the_temp(tmp_path):
    target = tmp_path / "metrics.json"
    write_text_atomically(target, "old")
    with pytest.raises(RuntimeError, match="disk full"), atomic_file(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_atomic_dir_swaps_the_old_folder_out(tmp_path):
    out = tmp_path / "base"
    with atomic_dir(out) as folder:
        assert folder.name.startswith(f".base.{writer_tag()}.") and folder.name.endswith(".partial")
        (folder / "a.txt").write_text("one")
    with atomic_dir(out) as folder:
        assert list(folder.iterdir()) == []  # starts empty, not a copy of the old folder
        (folder / "b.txt").write_text("two")
    assert [p.name for p in out.iterdir()] == ["b.txt"] and [p.name for p in tmp_path.iterdir()] == ["base"]


def test_failed_folder_write_keeps_the_previous_folder(tmp_path):
    out = tmp_path / "base"
    with atomic_dir(out) as folder:
        (folder / "a.txt").write_text("one")
    with pytest.raises(RuntimeError, match="disk full"), atomic_dir(out) as folder:
        (folder / "a.txt").write_text("half")
        raise RuntimeError("disk full")
    assert (out / "a.txt").read_text() == "one" and [p.name for p in tmp_path.iterdir()] == ["base"]


@contextlib.contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def umask_022():
    with umask(0o022):
        yield


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_file_written_through_each_file_helper_gets_a_plain_opens_mode(tmp_path, umask_022):
    # tempfile.mkstemp makes its temp 0600: reports/eval.html and metrics/eval.json came out unreadable to others.
    write_text_atomically(tmp_path / "eval.html", "<html></html>")
    with atomic_file(tmp_path / "eval.json") as tmp:
        tmp.write_text("{}")
    with open(tmp_path / "plain.txt", "w"):
        pass
    assert _mode(tmp_path / "plain.txt") == 0o644
    assert _mode(tmp_path / "eval.html") == 0o644 and _mode(tmp_path / "eval.json") == 0o644


def test_file_modes_follow_the_umask_and_keep_execute_bits(tmp_path):
    with umask(0o077):
        write_text_atomically(tmp_path / "private.txt", "x")
    with umask(0o022), atomic_file(tmp_path / "run.sh") as tmp:
        tmp.write_text("#!/bin/sh\n")
        tmp.chmod(0o700)
    assert _mode(tmp_path / "private.txt") == 0o600 and _mode(tmp_path / "run.sh") == 0o755


def test_a_folder_written_through_atomic_dir_and_its_files_get_plain_modes(tmp_path, umask_022):
    # mkdtemp makes the folder 0700, and safetensors' save_file writes model.safetensors 0600 on its own.
    import numpy as np
    from safetensors.numpy import save_file

    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not this write's")
    elsewhere.chmod(0o600)
    out = tmp_path / "hf"
    with atomic_dir(out) as folder:
        save_file({"w": np.zeros(3, np.float32)}, str(folder / "model.safetensors"))
        (folder / "params").mkdir()
        (folder / "params" / "written_private").write_bytes(b"x")
        (folder / "params" / "written_private").chmod(0o600)
        (folder / "link").symlink_to(elsewhere)
    assert _mode(out) == 0o755 and _mode(out / "params") == 0o755
    assert _mode(out / "model.safetensors") == 0o644 and _mode(out / "params" / "written_private") == 0o644
    assert _mode(elsewhere) == 0o600  # chmod through the link would change a file outside the output


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_write_removes_its_targets_temps_left_by_dead_writers_and_says_so(tmp_path, capsys):
    host = writer_tag().rsplit("-", 1)[0]
    dead = _dead_pid()
    partial = tmp_path / f".base.{host}-{dead}.abcd1234.partial"
    (partial / "sub").mkdir(parents=True)
    (partial / "sub" / "half.bin").write_bytes(b"x" * 3000)
    old = tmp_path / f".base.{host}-{dead}.abcd1234.old"
    old.mkdir()
    with atomic_dir(tmp_path / "base") as folder:
        (folder / "a.txt").write_text("one")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]
    err = capsys.readouterr().err
    assert f"removed stale temp {partial} (3.0 KB), left by {host}-{dead}" in err and str(old) in err

    stale_file = tmp_path / f".metrics.json.{host}-{dead}.zz_9abcd.tmp"
    stale_file.write_text("half")
    write_text_atomically(tmp_path / "metrics.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "metrics.json"]


def test_live_writers_other_hosts_and_other_targets_are_left_alone(tmp_path):
    host = writer_tag().rsplit("-", 1)[0]
    live = subprocess.Popen(["sleep", "30"])
    try:
        kept = [tmp_path / f".base.{host}-{live.pid}.abcd1234.partial",  # a live writer's
                tmp_path / f".base.{host}-{os.getpid()}.efgh5678.partial",  # this process's own
                tmp_path / f".base.otherhost-{_dead_pid()}.abcd1234.partial",  # its pid means nothing here
                tmp_path / f".base.json.{host}-{_dead_pid()}.abcd1234.tmp",  # another target's (base.json)
                tmp_path / ".base.abcd1234.partial"]  # not named by vlmgym: whose it is cannot be told
        for path in kept:
            path.mkdir()
        with atomic_dir(tmp_path / "base") as folder:
            (folder / "a.txt").write_text("one")
        assert all(path.exists() for path in kept)
    finally:
        live.kill()
        live.wait()


def test_a_reused_pid_does_not_keep_a_dead_writers_temp(tmp_path):
    # The pid of a temp written long before the process now holding that pid started belongs to a new process.
    host = writer_tag().rsplit("-", 1)[0]
    stale = tmp_path / f".base.{host}-{os.getpid()}.abcd1234.partial"
    stale.mkdir()
    os.utime(stale, (1e9, 1e9))  # 2001
    with atomic_dir(tmp_path / "base") as folder:
        (folder / "a.txt").write_text("one")
    assert not stale.exists()


KILLED_WRITE = """
import sys, time
from vlmgym.runtime.atomic import atomic_dir
with atomic_dir(sys.argv[1]) as tmp:
    (tmp / "data.bin").write_bytes(b"x" * 1000)
    if len(sys.argv) > 2:
        open(sys.argv[2], "w").close()
        time.sleep(60)
print("renamed")
"""


def _write(target, *extra, env=None, **kwargs):
    return subprocess.Popen([sys.executable, "-c", KILLED_WRITE, str(target), *map(str, extra)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_a_write_killed_before_its_rename_is_cleaned_by_its_janitor_at_once(tmp_path):
    target = tmp_path / "out" / "shards"
    writer = _write(target, env={**os.environ, killpoint.ENV: "out/shards"})
    out, err = writer.communicate(timeout=120)  # the janitor holds the pipes until it has finished
    assert writer.returncode == -signal.SIGKILL and "renamed" not in out, err
    assert "inside the write of" in err and "its writer died before finishing it" in err
    assert list(target.parent.iterdir()) == []
    out, err = _write(target).communicate(timeout=120)
    assert "renamed" in out and "removed" not in err
    assert [p.name for p in target.parent.iterdir()] == ["shards"] and (target / "data.bin").stat().st_size == 1000


def test_killing_the_writers_whole_process_group_spares_the_janitor(tmp_path):
    # What `kill -9 -- -PGID` of `dvc repro` does: the stage and everything in its group die at once.
    target, ready = tmp_path / "out" / "base", tmp_path / "ready"
    writer = _write(target, ready, start_new_session=True)
    for _ in range(600):
        if ready.exists():
            break
        time.sleep(0.1)
    [temp] = list(target.parent.iterdir())
    os.killpg(writer.pid, signal.SIGKILL)
    out, err = writer.communicate(timeout=120)
    assert f"removed {temp}" in err and not temp.exists() and not target.exists()


def test_clean_temps_sweeps_output_roots_and_dry_run_only_lists(tmp_path, capsys):
    host = writer_tag().rsplit("-", 1)[0]
    nested = tmp_path / "models" / "jax" / f".sft.{host}-{_dead_pid()}.abcd1234.partial"
    (nested / f".inner.{host}-{_dead_pid()}.abcd1234.tmp").mkdir(parents=True)  # inside a temp: goes with it
    live = tmp_path / "data" / f".shards.{host}-{os.getpid()}.abcd1234.partial"
    live.mkdir(parents=True)
    roots = [str(tmp_path / "data"), str(tmp_path / "models"), str(tmp_path / "missing")]
    assert temps.main(["--dry-run", *roots]) == 0
    out = capsys.readouterr().out
    assert f"would remove stale temp {nested}" in out and "would remove 1 stale temp(s)" in out
    assert "1 of live writers or other hosts left alone" in out and nested.exists()
    assert temps.main(roots) == 0
    assert "removed 1 stale temp(s)" in capsys.readouterr().out
    assert not nested.exists() and live.exists()


def test_the_kill_hook_is_registered_only_when_its_variable_is_set():
    # Normal runs: atomic writes and checkpoint saves call no test hook at all.
    assert write_hooks.before_rename == [] and write_hooks.at_checkpoint_save == []
    show = ("from vlmgym.runtime import write_hooks as h; "
            "print(len(h.before_rename), len(h.at_checkpoint_save))")
    armed = subprocess.run([sys.executable, "-c", show], env={**os.environ, killpoint.ENV: "x"}, capture_output=True,
                           text=True, timeout=120)
    assert armed.stdout.split() == ["1", "1"], armed.stderr
