"""The `vlmgym` command line: a table of subcommands, each imported only when used."""

from __future__ import annotations

import importlib
import sys

# name -> ("module:function", one-line help). Each function takes argv (list[str]) and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "params": ("vlmgym.params:main", "validate params.yaml (or another params file) and print it"),
    "parity": ("vlmgym.models.qwen3_vl.parity:main", "compare the JAX port with transformers on the same inputs"),
    "preset": ("vlmgym.presets:main", "merge a partial params file (e.g. configs/micro.yaml) into params.yaml"),
    "bench": ("vlmgym.bench:main", "benchmarks: `vlmgym bench rollout ...`, `vlmgym bench reward ...`"),
}


def usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: vlmgym <command> [args...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"vlmgym: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, func_name = COMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
