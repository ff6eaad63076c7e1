"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

# One persistent JAX compilation cache for the whole test session: this process, both pytest-xdist workers (they
# inherit os.environ) and every program a test starts (pipeline stages, fake-device children), so a program compiled
# once loads from disk wherever it is built again (a new trainer's jitted step compiles the same program as the last
# test's). Set here, before any test module imports JAX, which reads these variables at import. A size limit turns on
# JAX's file lock around each entry's read and write: without it a process could read an entry another one was still
# writing. With the lock each write also scans the whole folder, so only programs of 0.1 s or more are kept (the
# model's steps and decoders, not the many tiny array ops: with every program kept the full suite was no faster).
# A test that must compile afresh gives its child a cache of its own (tests/pipeline/test_kill_rerun.py).
_CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
_OWN_CACHE = None if _CACHE_VARIABLE in os.environ else tempfile.mkdtemp(prefix="vlmgym-tests-jax-cache-")
if _OWN_CACHE:
    os.environ.update({_CACHE_VARIABLE: _OWN_CACHE, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.1",
                       "JAX_COMPILATION_CACHE_MAX_SIZE": str(16 << 30)})


def pytest_unconfigure(config):
    if _OWN_CACHE:  # only the process that made the folder (the controller under xdist) removes it
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def fresh_jax_caches_per_module():
    """After each module, JAX drops the programs it holds in memory: a worker runs hundreds of tests, and long-lived
    workers that kept every compiled program aborted inside an XLA:CPU compile in full runs (none has with this, in
    one full run so far). What a later module needs again loads from the compilation cache above."""
    yield
    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()


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


# The longest setups and tests, first in each half of the collection: pytest-xdist's worksteal mode starts each of
# the two workers on one half, so one builds the shared micro pipeline while the other kills and reruns its own.
FIRST_HALF = ("pipeline/test_pipeline_e2e.py", "pipeline/test_compare.py", "pipeline/test_multiturn_pipeline.py",
              "pipeline/test_train_algorithms.py", "pipeline/test_dvc_remote.py", "pipeline/test_report_browser.py")
SECOND_HALF = ("pipeline/test_kill_rerun.py", "pipeline/test_mixture_env.py", "pipeline/test_external_env.py",
               "rl/test_multihost.py")


# Modules that take 15 s or more of a worker's time (measured with --durations on 2 cores): marked `slow`, so
# `make test-fast` (-m "not slow", no tests/pipeline) stays a few minutes; `make test` runs them all.
SLOW_MODULES = ("rl/test_lora_trainer.py", "rl/test_multihost.py", "rl/test_qwen_policy.py", "rl/test_shared_prefix.py",
                "rl/test_lora_dropout.py", "rl/test_lora.py", "rl/test_rl_learns.py", "rl/test_sharded.py",
                "bench/test_bench_rollout.py", "test_tracking.py", "plan/test_plan.py", "rl/test_trainer_toy.py",
                "test_run_recovery.py", "bench/test_bench_data.py", "rollout/test_multi_device.py",
                "rl/test_validation.py", "rollout/test_engine.py", "rl/test_mixture_trainer.py", "rl/test_ppo.py",
                "rl/test_remat.py", "models/test_decode.py", "rl/test_dpo.py", "models/test_model_parity.py",
                "rl/test_lora_export.py", "models/test_sharding.py", "models/test_parity_cli.py",
                "rl/test_objective_knobs_trainer.py", "rl/test_multiturn_trainer.py", "rollout/test_episodes.py")


@pytest.hookimpl(tryfirst=True)  # the markers must be there before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """Order the suite for two workers: FIRST_HALF's modules, then other tests up to the middle, then SECOND_HALF's,
    then the rest (the shortest tests last: what an idle worker steals from the other's tail). Only speed depends
    on this order."""
    def module(item) -> str:
        return item.nodeid.split("::")[0].removeprefix("tests/")

    first = [i for i in items if module(i) in FIRST_HALF]
    second = [i for i in items if module(i) in SECOND_HALF]
    rest = [i for i in items if module(i) not in FIRST_HALF + SECOND_HALF]
    first.sort(key=lambda i: FIRST_HALF.index(module(i)))  # stable: each module's tests keep their order
    second.sort(key=lambda i: SECOND_HALF.index(module(i)))
    for item in items:
        if module(item) in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    filler = max(0, len(items) // 2 - len(first))
    items[:] = first + rest[:filler] + second + rest[filler:]


@pytest.fixture
def scoped_envs():
    """Envs a test registers are gone after it (vlmgym.envs.registry.scoped_registrations)."""
    from vlmgym.envs import registry

    with registry.scoped_registrations():
        yield
