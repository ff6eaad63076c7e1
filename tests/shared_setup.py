"""Setups that every pytest-xdist worker of a test session shares (imported by conftest files)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def session_folder(tmp_path_factory) -> Path:
    """The test session's temp folder: under pytest-xdist the one above every worker's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_across_workers(tmp_path_factory, name: str, build: Callable[[Path], dict]) -> dict:
    """`build(folder)` once per test session, by whichever pytest-xdist worker asks first (a file lock); the others
    wait for it and read what it returned (JSON). For the expensive setups, the micro pipeline runs, that tests on
    any worker may share: a worker never runs one a second time. A build that failed fails the others too."""
    session = session_folder(tmp_path_factory)
    done, failed = session / f"{name}.json", session / f"{name}.failed"
    with FileLock(str(session / f"{name}.lock")):
        if done.exists():
            return json.loads(done.read_text())
        if failed.exists():
            pytest.fail(f"{name}: its setup failed on another worker:\n{failed.read_text()[-4000:]}")
        folder = session / name
        shutil.rmtree(folder, ignore_errors=True)  # what a worker that crashed in it left
        folder.mkdir()
        try:
            value = build(folder)
        except BaseException as err:
            failed.write_text(f"{type(err).__name__}: {err}")
            raise
        done.write_text(json.dumps(value))
        return value
