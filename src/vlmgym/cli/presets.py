"""Presets: a partial params file (e.g. configs/micro.yaml) merged over params.yaml, validated, written atomically.

    vlmgym preset configs/micro.yaml            # rewrites params.yaml with the preset's keys replaced
    vlmgym preset configs/micro.yaml --params other.yaml

Mappings merge key by key; any other value (lists included) replaces the old one. The result is validated as a
whole (unknown keys, types, ranges) before params.yaml is touched, and written with every key's doc comment.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlmgym import params as params_mod


def apply_preset(preset: str | Path, params_file: str | Path = params_mod.DEFAULT_PARAMS_FILE) -> dict[str, Any]:
    """Merge `preset` into `params_file` in place (validated first); returns the validated sections."""
    return apply_overlay(params_mod.read_yaml(preset), params_file, what=str(preset))


def apply_overlay(overlay: Mapping[str, Any], params_file: str | Path = params_mod.DEFAULT_PARAMS_FILE,
                  what: str = "the overlay") -> dict[str, Any]:
    """Merge a partial params mapping into `params_file` in place (validated first); returns the sections."""
    return params_mod.write_params(params_mod.merged(params_mod.read_yaml(params_file), overlay), params_file, what)


def main(argv: list[str]) -> int:
    """`vlmgym preset FILE [--params params.yaml]`: merge a preset into the params file."""
    parser = argparse.ArgumentParser(prog="vlmgym preset", description=main.__doc__)
    parser.add_argument("preset", help="partial params file, e.g. configs/micro.yaml")
    parser.add_argument("--params", default=str(params_mod.DEFAULT_PARAMS_FILE), help="params file rewritten")
    args = parser.parse_args(argv)
    try:
        apply_preset(args.preset, args.params)
    except params_mod.ParamsError as err:
        print(f"error: {err}")
        return 1
    print(f"{args.params}: merged {args.preset}")
    return 0
