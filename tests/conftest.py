"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from shared_setup import session_folder


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
    compilation cache per test session (both workers), so a program compiled by one `dvc repro` loads from disk in
    the next (a micro repro: ~5.4 -> ~3.6 min here). Set in os.environ, which every child's environment copies;
    this process's JAX read its settings at import and is unaffected. A child that must compile afresh gets a
    cache of its own (tests/pipeline/test_kill_rerun.py)."""
    import jax  # noqa: F401  (imported before the variables are set: this process keeps compiling in memory only)

    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(session_folder(tmp_path_factory) / "jax-compilation-cache")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the micro model's programs compile in < 1 s
    yield
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        os.environ.pop(name, None)


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
