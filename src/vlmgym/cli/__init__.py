"""The `vlmgym` command line: a table of subcommands, each imported only when used."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# name -> ("module:function", one-line help). Each function takes argv (list[str]) and returns an exit code.
Table = dict[str, tuple[str, str]]

COMMANDS: Table = {
    "params": ("vlmgym.params:main", "validate params.yaml (or another params file) and print it"),
    "preset": ("vlmgym.cli.presets:main",
               "write a partial params file (e.g. configs/micro.yaml) over the defaults, or --on-top over params.yaml"),
    "recipe": ("vlmgym.cli.recipes:main", "switch params.yaml to an env with the settings it trains with"),
    "parity": ("vlmgym.models.qwen3_vl.parity:main", "compare the JAX port with transformers on the same inputs"),
    "clean-temps": ("vlmgym.runtime.temps:main",
                    "remove temp outputs that killed runs left behind (live writers' kept)"),
    "compare": ("vlmgym.compare.command:main",
                "train SFT-longer, GRPO, PPO and DPO from the SFT model at one budget; compare"),
    "study": ("vlmgym.compare.study:main", "a comparative study as a DVC pipeline: `vlmgym study new NAME`, then "
                                           "dvc repro studies/NAME/dvc.yaml"),
    "bench": ("vlmgym.bench:main", "benchmarks: `vlmgym bench <benchmark> [args...]`, each listed below"),
    "tracking": ("vlmgym.cli.tracking:main", "MLflow: `vlmgym tracking sync` sends the logs stages kept while "
                                             "their server was down"),
    "plan": ("vlmgym.plan.cli:main", "per-device memory of a training step for a config and mesh (XLA, no weights)"),
}


def listing(table: Table) -> list[str]:
    width = max(len(n) for n in table)
    return [f"  {name:<{width}}  {help_}" for name, (_, help_) in table.items()]


def usage(prog: str, table: Table, what: str = "command") -> str:
    return "\n".join([f"usage: {prog} <{what}> [args...]", "", f"{what}s:", *listing(table)])


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


def version() -> str:
    """The installed vlmgym's version; in a source tree that is not installed (`python -m vlmgym.cli` on
    PYTHONPATH), the version its pyproject.toml gives."""
    from importlib import metadata

    try:
        return metadata.version("vlmgym")
    except metadata.PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"  # src/vlmgym/cli/ -> the tree's root
        try:
            return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown (not installed, and no pyproject.toml above its source)"


def help_text() -> str:
    """`vlmgym --help`: the commands, then every `vlmgym bench` benchmark (read from the bench package's own table,
    so a new benchmark is listed without an edit here), then the options."""
    # Imported by name, as dispatch() imports a command: vlmgym.bench stays out of what the dispatcher imports (a
    # study's stages depend on every module the dispatcher can import, vlmgym.compare.layout).
    benchmarks: Table = importlib.import_module(COMMANDS["bench"][0].split(":")[0]).BENCHMARKS
    options: Table = {"-h, --help": ("", "this list"), "--version": ("", "vlmgym's version")}
    return "\n".join([usage("vlmgym", COMMANDS), "", "`vlmgym bench` benchmarks:", *listing(benchmarks), "",
                      "options:", *listing(options)])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--version"]:
        print(f"vlmgym {version()}")
        return 0
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(help_text())
        return 0
    return dispatch("vlmgym", COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
