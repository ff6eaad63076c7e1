"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def run_on_cpu_devices() -> Callable[..., str]:
    """run(count, args, cwd=None): `python *args` in a fresh interpreter that sees `count` fake CPU devices (the
    XLA flag only works before JAX starts, so multi-device tests run in a child); returns its stdout."""

    def run(count: int, args: Sequence[str | Path], cwd: str | Path | None = None) -> str:
        env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={count}", "JAX_PLATFORMS": "cpu"}
        done = subprocess.run([sys.executable, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    return run
