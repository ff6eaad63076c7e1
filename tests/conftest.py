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

        def remove_node(self, node: object) -> str | None:
            # xdist queues again every module a crashed worker ever had, finished ones too; a finished module sent
            # to a worker is an empty run request, after which that worker never asks for more: the run hangs.
            # Only the modules with tests left go back.
            self.assigned_work[node] = {scope: unit for scope, unit in self.assigned_work[node].items()
                                        if not all(unit.values())}
            return super().remove_node(node)

        def mark_test_pending(self, item: str) -> None:
            # pytest-rerunfailures runs a crashed worker's test again: remove_node has queued its module's
            # unfinished tests, this one among them; make sure it is there and hand the work out.
            self.workqueue.setdefault(self._split_scope(item), {})[item] = False
            for node in list(self.assigned_work):
                self._reschedule(node)

    return ModuleScheduling(config, log)


@pytest.fixture
def scoped_envs():
    """Envs a test registers are gone after it (vlmgym.envs.registry.scoped_registrations)."""
    from vlmgym.envs import registry

    with registry.scoped_registrations():
        yield
