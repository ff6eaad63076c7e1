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


@pytest.fixture(scope="session", autouse=True)
def child_jax_compilation_cache(tmp_path_factory):
    """The JAX programs that tests start (the pipeline's stages, the fake-device children) share one persistent
    compilation cache per test process, so a program compiled by one `dvc repro` loads from disk in the next (a
    micro repro: ~5.4 -> ~3.6 min here). Set in os.environ, which every child's environment copies; this process's
    JAX read its settings at import and is unaffected. A child that must compile afresh drops the variables
    (pipeline_helpers.without_compilation_cache)."""
    import jax  # noqa: F401  (imported before the variables are set: this process keeps compiling in memory only)

    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "jax-compilation-cache")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the micro model's programs compile in < 1 s
    yield
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        os.environ.pop(name, None)



@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """How `make test` spreads the suite over its workers (pytest-xdist, --dist loadgroup): a module's tests stay
    together (its module fixtures run once), and every test of the micro pipeline run (the `pipeline` fixture,
    session-scoped: one run per worker that needs it) shares one group, which goes first because it is the
    longest (~half the suite). Without xdist the marks do nothing and only the order changes."""
    for item in items:
        group = "pipeline" if "pipeline" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: "pipeline" not in getattr(item, "fixturenames", ()))  # stable: keeps the rest
