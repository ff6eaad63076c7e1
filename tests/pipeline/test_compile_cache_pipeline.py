"""A stage keeps its compiled programs in vlmgym's compilation cache (vlmgym.runtime.compile_cache): run again, it
loads them instead of compiling, and writes the same bytes as the pipeline did with programs compiled afresh."""

from __future__ import annotations

import re

import pytest
from pipeline_helpers import copy_of, output_digests, run_checked, stages_run

pytestmark = pytest.mark.slow

HIT = re.compile(r"Persistent compilation cache hit for '([^']+)'")


def _rollout_outputs(digests: dict[str, str]) -> dict[str, str]:
    return {path: md5 for path, md5 in digests.items() if path.startswith("outputs/rollouts/")}


def test_a_stage_loads_its_programs_from_the_cache_on_its_next_run_and_writes_the_same_bytes(pipeline, tmp_path):
    root, env = copy_of(pipeline, tmp_path / "checkout")
    cache = tmp_path / "cache"
    # the stage's own default, not the test session's shared cache (tests/conftest.py); JAX_LOG_COMPILES makes JAX
    # name each program it loads from the cache
    env = {k: v for k, v in env.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
    env.update(VLMGYM_COMPILE_CACHE=str(cache), JAX_LOG_COMPILES="1")
    expected = _rollout_outputs(pipeline["digests"])
    assert expected

    first = run_checked(["dvc", "repro", "-f", "-s", "rollout"], root, env)
    assert stages_run(first.stdout) == ["rollout"]
    assert not HIT.findall(first.stderr)  # an empty cache: every program compiled
    kept = {entry.name.split("-")[0] for entry in cache.glob("*-cache")}
    assert {"jit__prefill_group", "jit__decode_loop"} <= kept  # the sampler's programs, written by the stage
    assert _rollout_outputs(output_digests(root)) == expected

    second = run_checked(["dvc", "repro", "-f", "-s", "rollout"], root, env)
    assert {"jit__prefill_group", "jit__decode_loop"} <= set(HIT.findall(second.stderr))
    assert _rollout_outputs(output_digests(root)) == expected

    env["VLMGYM_COMPILE_CACHE"] = "off"
    third = run_checked(["dvc", "repro", "-f", "-s", "rollout"], root, env)
    assert not HIT.findall(third.stderr)
    assert _rollout_outputs(output_digests(root)) == expected
