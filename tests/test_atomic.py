"""Atomic writes: the target changes only when the block succeeds, temps never stay, temp names carry the writer."""

from __future__ import annotations

import os
import socket

import pytest

from vlmgym.atomic import atomic_dir, atomic_file, write_text_atomically, writer_tag


def test_writer_tag_is_host_and_pid_without_dots():
    host, pid = writer_tag().rsplit("-", 1)
    assert int(pid) == os.getpid() and "." not in host and host
    if all(c.isalnum() or c in "_-" for c in socket.gethostname()):
        assert host == socket.gethostname()


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


def test_atomic_dir_removes_partial_folders_of_an_interrupted_run(tmp_path):
    stale = tmp_path / ".base.otherhost-1.abcd1234.partial"
    stale.mkdir()
    (stale / "half.txt").write_text("half")
    with atomic_dir(tmp_path / "base") as folder:
        (folder / "a.txt").write_text("one")
    assert [p.name for p in tmp_path.iterdir()] == ["base"]
