"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import pytest

# One persistent JAX compilation cache per test process, shared with the JAX programs it starts (the pipeline's
# stages, the fake-device children: their environments copy os.environ): a program compiled once loads from disk
# the next time any test builds it (a micro `dvc repro`: ~5.4 -> ~3.6 min here). Set before this process compiles
# anything; a child that must compile afresh drops the variables (pipeline_helpers.without_compilation_cache).
COMPILATION_CACHE = tempfile.mkdtemp(prefix="vlmgym-tests-jax-cache-")
os.environ["JAX_COMPILATION_CACHE_DIR"] = COMPILATION_CACHE
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the tiny model's programs compile in < 1 s
jax.config.update("jax_compilation_cache_dir", COMPILATION_CACHE)  # should JAX have been imported before this
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


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


def pytest_unconfigure(config):
    shutil.rmtree(COMPILATION_CACHE, ignore_errors=True)


# The modules whose tests use the `pipeline` fixture (tests/pipeline/conftest.py): one session-scoped micro pipeline
# run, which each test process that needs it runs once. `make test` keeps them on one worker; a module that uses it
# but is missing here is refused at collection (else it would quietly run the whole pipeline a second time).
PIPELINE_MODULES = frozenset(f"tests/pipeline/test_{name}.py" for name in (
    "pipeline_e2e", "kill_rerun", "dvc_remote", "compare", "train_algorithms", "report_browser"))


def pytest_collection_modifyitems(config, items):
    """The micro pipeline run's tests go first (the longest group: on its own worker from the start)."""
    for item in items:
        module = item.nodeid.split("::")[0]
        if "pipeline" in getattr(item, "fixturenames", ()) and module not in PIPELINE_MODULES:
            raise pytest.UsageError(f"{module} uses the `pipeline` fixture: add it to PIPELINE_MODULES in "
                                    "tests/conftest.py")
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in PIPELINE_MODULES)  # stable: keeps the rest


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown (and unused) without it
def pytest_xdist_make_scheduler(config, log):
    """How `make test` (`-n auto --dist loadscope --no-loadscope-reorder`) spreads the suite over its workers: a
    module's tests stay on one worker (its module fixtures run once) and the PIPELINE_MODULES share one, in
    collection order (the pipeline group first). xdist's own loadgroup marks no longer reach its scheduler under
    pytest 9.2 (it renames `item._nodeid`, which pytest 9.2 no longer reads)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return "pipeline" if module in PIPELINE_MODULES else module

    return ModuleScheduling(config, log)
