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
from vlmgym.runtime.atomic import atomic_file


def apply_preset(preset: str | Path, params_file: str | Path = params_mod.DEFAULT_PARAMS_FILE) -> dict[str, Any]:
    """Merge `preset` into `params_file` in place (validated first); returns the validated sections."""
    return apply_overlay(params_mod.read_yaml(preset), params_file, what=str(preset))


def apply_overlay(overlay: Mapping[str, Any], params_file: str | Path = params_mod.DEFAULT_PARAMS_FILE,
                  what: str = "the overlay") -> dict[str, Any]:
    """Merge a partial params mapping into `params_file` in place (validated first); returns the sections."""
    merged = params_mod.merged(params_mod.read_yaml(params_file), overlay)
    params_file = Path(params_file)
    lines = params_file.read_text().splitlines()
    header = "".join(f"{line}\n" for line in lines[: next((i for i, x in enumerate(lines) if not x.startswith("#")),
                                                           len(lines))])
    import yaml

    # Validated from the temp file itself (load_all reads a path); params_file is replaced only when it loads.
    with atomic_file(params_file) as tmp:
        tmp.write_text(yaml.safe_dump(merged, sort_keys=False))
        try:
            sections = params_mod.load_all(tmp)
        except params_mod.ParamsError as err:
            raise params_mod.ParamsError(f"{what} merged into {params_file}: {err}") from err
        tmp.write_text(header + ("\n" if header else "") + params_mod.render_yaml(sections))
    return sections


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
