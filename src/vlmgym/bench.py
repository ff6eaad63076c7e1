"""`vlmgym bench <name> ...`: the benchmarks, each in the module that owns what it measures."""

from __future__ import annotations

from vlmgym.cli import Table, dispatch

BENCHMARKS: Table = {
    "rollout": ("vlmgym.rollout.benchmark:main", "JAX rollout engine vs transformers generate (tokens/s, roofline)"),
    "reward": ("vlmgym.envs.bench_reward:main", "reward computation throughput"),
}


def main(argv: list[str]) -> int:
    """Dispatch to one benchmark's main(argv)."""
    return dispatch("vlmgym bench", BENCHMARKS, argv, what="benchmark")
