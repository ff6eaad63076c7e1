"""`vlmgym bench <name> ...`: the benchmarks, each in the module that owns what it measures."""

from __future__ import annotations

import importlib
import sys

# name -> ("module:function", one-line help); each function takes argv (list[str]) and returns an exit code.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "rollout": ("vlmgym.rollout.benchmark:main", "JAX rollout engine vs transformers generate (tokens/s, roofline)"),
    "reward": ("vlmgym.envs.bench_reward:main", "reward computation throughput"),
}


def usage() -> str:
    lines = ["usage: vlmgym bench <benchmark> [args...]", "", "benchmarks:"]
    lines += [f"  {name:<8}  {help_}" for name, (_, help_) in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Dispatch to one benchmark's main(argv)."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"vlmgym bench: unknown benchmark {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, func_name = BENCHMARKS[name][0].split(":")
    return int(getattr(importlib.import_module(module_name), func_name)(rest) or 0)
