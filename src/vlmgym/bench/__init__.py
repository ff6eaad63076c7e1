"""`vlmgym bench <name> ...`: the benchmarks, one module each.

Nothing outside this package imports it, so editing a benchmark changes no pipeline stage's code (nor its DVC
deps). `vlmgym --help` lists BENCHMARKS too (vlmgym.cli.help_text, which loads this module by name): a benchmark
added to the table is listed there as well.
"""

from __future__ import annotations

from vlmgym.cli import Table, dispatch

BENCHMARKS: Table = {
    "rollout": ("vlmgym.bench.rollout:main", "JAX rollout engine vs transformers generate (tokens/s, roofline)"),
    "reward": ("vlmgym.bench.reward:main", "reward computation throughput"),
    "learner": ("vlmgym.bench.learner:main", "GRPO update: one prompt copy per completion vs one per group"),
    "data": ("vlmgym.bench.data:main", "training input pipeline: samples/s and peak RSS at the default split and 10x"),
    "episodes": ("vlmgym.bench.episodes:main", "multi-turn episodes: what prefilling each later turn's conversation "
                 "again costs"),
    "shard": ("vlmgym.bench.shard:main", "shard stage images/s with one worker and with every core (same bytes)"),
    "stage-start": ("vlmgym.bench.stage_start:main", "seconds from a stage's process start to its work, per stage "
                    "(two checkouts side by side)"),
    "compile-cache": ("vlmgym.bench.compile_cache:main", "a whole `dvc repro -f` with the compilation cache off, "
                      "empty and warm (same outputs checked)"),
}


def main(argv: list[str]) -> int:
    """Dispatch to one benchmark's main(argv)."""
    return dispatch("vlmgym bench", BENCHMARKS, argv, what="benchmark")
