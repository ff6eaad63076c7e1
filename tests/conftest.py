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


# The session's XLA:CPU compiles at LLVM optimisation level 0 with the older (non-MLIR) fusion emitters: the same
# HLO programs, compiled in about a quarter of the time (a tiny model's GRPO step, 3.9 s -> 1.0 s on 2 cores) and
# run at most ~20% slower, which is the right trade for a suite of mostly small, freshly compiled programs. The
# float results may differ in the last bits from XLA's default build of a program, and every check in the suite
# holds under both: determinism, resume and parity compare runs of one session (same flags), and the HF parity
# tolerances are far above that rounding. Set XLA_FLAGS yourself (even empty: `XLA_FLAGS= make test`) to run the
# suite with XLA's defaults. Children that need fake devices add theirs to these (with_host_devices).
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("XLA_FLAGS", FAST_COMPILE_FLAGS)


def with_host_devices(count: int) -> str:
    """The session's XLA_FLAGS plus `count` fake CPU devices (for a child process: JAX reads the flag at start)."""
    from vlmgym.plan.cli import with_device_count  # the flag rewriting `vlmgym plan` does for its children

    return with_device_count(os.environ.get("XLA_FLAGS", ""), count)


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
        env = {**os.environ, "XLA_FLAGS": with_host_devices(count), "JAX_PLATFORMS": "cpu"}
        done = subprocess.run([sys.executable, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    return run


# The longest setups and tests, first in each half of the collection: pytest-xdist's worksteal mode starts each of
# the two workers on one half, so one builds the shared micro pipeline while the other kills and reruns its own.
FIRST_HALF = ("pipeline/test_pipeline_e2e.py", "pipeline/test_multiturn_pipeline.py",
              "pipeline/test_train_algorithms.py", "pipeline/test_dvc_remote.py", "pipeline/test_report_browser.py",
              "pipeline/test_ovd_pipeline.py", "compare/test_forgetting_pipeline.py")
SECOND_HALF = ("pipeline/test_kill_rerun.py", "pipeline/test_mixture_env.py", "pipeline/test_external_env.py",
               "compare/test_study_pipeline.py", "rl/test_multihost.py", "pipeline/test_user_data_pipeline.py",
               "pipeline/test_qwen25_pipeline.py")


# Seconds of a worker's time per module, for the other modules of 5 s or more (`--durations=0` of a full run on 2
# cores, with the fast-compile flags above): they order the suite below. Those of SLOW_SECONDS or more mark
# themselves `pytestmark = pytest.mark.slow`, so `make test-fast` (-m "not slow", no tests/pipeline) stays a few
# minutes; `make test` runs them all. tests/project/test_markers.py keeps the marks, these tables and the files in step.
MODULE_SECONDS = {
    "rl/test_multiturn_trainer.py": 134, "tracking/test_tracking.py": 95, "rl/test_multihost.py": 75,
    "rl/test_rl_learns.py": 63, "pipeline/test_tracking_server.py": 47, "rl/test_qwen_policy.py": 39,
    "rl/test_lora_trainer.py": 30, "rl/test_sharded.py": 27, "bench/test_bench_rollout.py": 24, "rl/test_lora.py": 23,
    "bench/test_bench_data.py": 21, "rl/test_shared_prefix.py": 18, "rollout/test_episodes.py": 17,
    "pipeline/test_report_without_mlflow.py": 15, "tracking/test_run_recovery.py": 15, "plan/test_plan.py": 15,
    "tracking/test_tracking_concurrent_open.py": 14, "models/test_decode.py": 12, "rollout/test_engine.py": 12,
    "rl/test_trainer_toy.py": 11, "tracking/test_model_registry.py": 10, "rollout/test_multi_device.py": 10,
    "rl/test_validation.py": 9, "models/test_model_parity.py": 9, "rl/test_objective_knobs_trainer.py": 9,
    "rl/test_remat.py": 9, "rl/test_ppo.py": 8, "envs/test_rec.py": 7, "rl/test_lora_dropout.py": 7,
    "tracking/test_system_metrics.py": 6, "models/test_parity_cli.py": 6, "rl/test_grpo.py": 6,
    "models/test_sharding.py": 5, "rl/test_perception.py": 5, "rl/test_dpo.py": 5, "pipeline/test_resume_inputs.py": 50,
    "tracking/test_tracking_registration.py": 40, "rl/test_non_finite.py": 12, "compare/test_study_pipeline.py": 161,
    "models/test_qwen25_vl_parity.py": 49, "models/test_qwen25_vl_decode.py": 12, "rl/test_qwen25_learner.py": 60,
    "bench/test_bench_stage_start.py": 25, "bench/test_bench_compile_cache.py": 11,
    "pipeline/test_compile_cache_pipeline.py": 52,
    # 14 stages like the study pipeline's; timed beside another long job, scaled to that module's quiet 161 s
    "compare/test_forgetting_pipeline.py": 200}
SLOW_SECONDS = 9


# A worker's time on FIRST_HALF's or SECOND_HALF's modules (each about 12 min on 2 cores).
HEAD_SECONDS = 720


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects and other plugins reorder: the order the suite was timed in
def pytest_collection_modifyitems(config, items):
    """Order the suite for its workers (pytest-xdist's worksteal gives each worker an equal share of the list, in
    order, and lets an idle worker take tests from the end of another's): FIRST_HALF's modules head the first share
    and SECOND_HALF's the second; the other modules of MODULE_SECONDS follow, each on the share with the least time
    so far, longest first; the short tests fill every share last, so what a worker steals at the end is short. Only
    speed depends on this order."""
    def module(item) -> str:
        return item.nodeid.split("::")[0].removeprefix("tests/")

    by_module: dict[str, list] = {}
    for item in items:  # each module's tests stay together, in their order
        by_module.setdefault(module(item), []).append(item)
    workers = max(2, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "2")))
    shares = [[name for name in heads if name in by_module] for heads in (FIRST_HALF, SECOND_HALF)]
    shares += [[] for _ in range(workers - 2)]
    seconds = [HEAD_SECONDS, HEAD_SECONDS] + [0] * (workers - 2)
    for name in sorted(MODULE_SECONDS, key=MODULE_SECONDS.get, reverse=True):
        if name in by_module and name not in FIRST_HALF + SECOND_HALF:
            lightest = seconds.index(min(seconds))
            shares[lightest].append(name)
            seconds[lightest] += MODULE_SECONDS[name]
    placed = {name for share in shares for name in share}
    short = [item for item in items if module(item) not in placed]
    ordered, left = [], len(items)
    for index, share in enumerate(shares):
        size = left // (workers - index)  # worksteal's first split: what is left, over the workers still to serve
        head = [item for name in share for item in by_module[name]]
        fill = max(0, size - len(head))
        ordered += head + short[:fill]
        short, left = short[fill:], left - len(head) - fill
    items[:] = ordered + short


@pytest.fixture
def scoped_envs():
    """Envs a test registers are gone after it (vlmgym.envs.registry.scoped_registrations)."""
    from vlmgym.envs import registry

    with registry.scoped_registrations():
        yield


def pytest_configure(config):
    """Each test process collects cyclic garbage at the pipeline stages' pace (vlmgym.runtime.collector)."""
    from vlmgym.runtime.collector import collect_less

    collect_less()
