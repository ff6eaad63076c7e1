"""vlmgym recipe: switch the pipeline to an env together with the settings that env trains with.

    vlmgym recipe <env>                          # rewrites params.yaml: the defaults with the recipe
    vlmgym recipe <env> --on-top                 # rewrites params.yaml: its values with the recipe
    dvc exp run $(vlmgym recipe <env> --overrides)   # as --on-top, as an experiment; params.yaml untouched

An env's recipe is its class attribute `Env.recipe`: a partial params mapping over the other sections (e.g.
{"sft": {"optimizer": {"lr": 0.001}}}). Applying env X sets env.name and env.recipe to X and every key that any
registered env's recipe sets to X's value, or to the key's default where X's recipe leaves it out, so moving from
one env to another never keeps the first one's settings. The defaults are the default env's recipe. A stage whose
env.recipe names another env than env.name stops (vlmgym.params.EnvParams), so `-S env.name=...` alone is
an error, not a run with another task's settings. Like `vlmgym preset` (vlmgym.cli.presets), it starts from the
defaults unless --on-top, and prints every key whose value it changed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from vlmgym import params as params_mod
from vlmgym.recipes import paths, recipe_overlay


def overrides(overlay: Mapping[str, Any]) -> list[str]:
    """The overlay as `dvc exp run` arguments: -S ++key=value each, values in YAML flow style. `++` sets a key
    whether params.yaml holds it or not (a generator's own section is absent from the default params until set);
    a bare key=value fails on an absent one."""
    out = []
    for path, value in paths(overlay):
        # no spaces, so the line survives the shell's word splitting in `dvc exp run $(...)`
        plain = isinstance(value, str) and value.replace("_", "").replace(":", "").replace(".", "").isalnum()
        text = value if plain else "''" if value == "" else json.dumps(value, separators=(",", ":"))
        out += ["-S", f"++{'.'.join(path)}={text}"]
    return out


def main(argv: list[str]) -> int:
    """`vlmgym recipe ENV [--on-top] [--params params.yaml] [--overrides]`: switch to ENV with its recipe, over the
    defaults (or the params file's values), printing the keys it changed."""
    parser = argparse.ArgumentParser(prog="vlmgym recipe", description=main.__doc__)
    parser.add_argument("env", help="a registered env name, an entry point or 'package.module:Class'")
    parser.add_argument("--params", default=str(params_mod.DEFAULT_PARAMS_FILE), help="params file rewritten")
    parser.add_argument("--overrides", action="store_true",
                        help="print the recipe as `dvc exp run` -S arguments instead of rewriting the params file "
                             "(dvc applies them over params.yaml's values, as --on-top does)")
    parser.add_argument("--on-top", action="store_true",
                        help="apply the recipe over the params file's values instead of the defaults")
    args = parser.parse_args(argv)
    from vlmgym.cli.presets import apply_overlay, changes, file_values, report, values

    try:
        overlay = recipe_overlay(args.env)
        if args.overrides:
            print(" ".join(overrides(overlay)))
            return 0
        before = file_values(args.params)
        sections = apply_overlay(overlay, args.params, what=f"the recipe of {args.env}", on_top=args.on_top)
    except (params_mod.ParamsError, ValueError, ImportError, KeyError) as err:
        print(f"error: {err.args[0] if isinstance(err, KeyError) else err}")
        return 1
    print(report(args.params, f"env {args.env} with its recipe", args.on_top, changes(before, values(sections))))
    return 0
