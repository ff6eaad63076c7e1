"""The `vlmgym` command line: a table of subcommands, each imported only when used."""

from __future__ import annotations

import importlib
import sys

# name -> ("module:function", one-line help). Each function takes argv (list[str]) and returns an exit code.
Table = dict[str, tuple[str, str]]

COMMANDS: Table = {
    "params": ("vlmgym.params:main", "validate params.yaml (or another params file) and print it"),
    "preset": ("vlmgym.cli.presets:main", "merge a partial params file (e.g. configs/micro.yaml) into params.yaml"),
    "recipe": ("vlmgym.cli.recipes:main", "switch params.yaml to an env with the settings it trains with"),
    "parity": ("vlmgym.models.qwen3_vl.parity:main", "compare the JAX port with transformers on the same inputs"),
    "clean-temps": ("vlmgym.runtime.temps:main",
                    "remove temp outputs that killed runs left behind (live writers' kept)"),
    "compare": ("vlmgym.compare.command:main",
                "train SFT-longer, GRPO, PPO and DPO from the SFT model at one budget; compare"),
    "study": ("vlmgym.compare.study:main", "a comparative study as a DVC pipeline: `vlmgym study new NAME`, then "
                                           "dvc repro studies/NAME/dvc.yaml"),
    "bench": ("vlmgym.bench:main", "benchmarks: `vlmgym bench rollout ...`, `vlmgym bench reward ...`"),
    "tracking": ("vlmgym.cli.tracking:main", "MLflow: `vlmgym tracking sync` sends the logs stages kept while "
                                             "their server was down"),
    "plan": ("vlmgym.plan.cli:main", "per-device memory of a training step for a config and mesh (XLA, no weights)"),
}


def usage(prog: str, table: Table, what: str = "command") -> str:
    width = max(len(n) for n in table)
    lines = [f"usage: {prog} <{what}> [args...]", "", f"{what}s:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in table.items()]
    return "\n".join(lines)


def dispatch(prog: str, table: Table, argv: list[str], what: str = "command") -> int:
    """Run the table entry named by argv[0] with the rest of argv (or print usage)."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(prog, table, what))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in table:
        print(f"{prog}: unknown {what} {name!r}\n\n{usage(prog, table, what)}", file=sys.stderr)
        return 2
    module_name, func_name = table[name][0].split(":")
    from vlmgym.runtime.errors import guarded

    # a user's error (a params value, a YAML typo, a missing file) is one line naming the command, not a traceback
    return guarded(f"{prog} {name}", lambda: getattr(importlib.import_module(module_name), func_name)(rest))


def main(argv: list[str] | None = None) -> int:
    return dispatch("vlmgym", COMMANDS, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
