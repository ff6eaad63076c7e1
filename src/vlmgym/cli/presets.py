"""Presets: a partial params file (e.g. configs/micro.yaml) applied over the defaults, or over the params file's
values with --on-top; validated, written atomically, and the keys it changed printed.

    vlmgym preset configs/micro.yaml                   # params.yaml: the defaults with micro's keys
    vlmgym preset configs/micro_tools.yaml --on-top    # params.yaml as it is, with micro_tools' keys
    vlmgym preset configs/micro.yaml --params other.yaml

The defaults are every key's default value (what `vlmgym params --yaml` prints for an empty file) with the default
env's recipe, the values a fresh checkout's params.yaml holds (but for its validation batch sizes): a key the preset
leaves out goes back to its default, one set by hand (tracking.tracking_uri) too; --on-top keeps the file's values.
Either way every key whose value changed is printed with its previous and its new value. Mappings merge key by key;
any other value (lists included) replaces the old one; a key's other name (TRL's train.num_generations) replaces the
key held under vlmgym's name (group_size). The result is validated as a whole (unknown keys, types, ranges) before
the file is touched, and written with every key's doc comment, the file's leading comment kept.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from vlmgym import params as params_mod
from vlmgym.recipes import paths


def defaults() -> dict[str, Any]:
    """Every key at its default, as a params file holds them (the default env's own sections included), with the
    default env's recipe: the params a fresh checkout ships, so a preset over the defaults starts where a new
    user's params.yaml does."""
    from vlmgym.envs.registry import DEFAULT_ENV
    from vlmgym.recipes import recipe_overlay

    return params_mod.merged(values(params_mod.default_sections()), recipe_overlay(DEFAULT_ENV))


def values(sections: Mapping[str, Any]) -> dict[str, Any]:
    return {name: params_mod.to_dict(section) for name, section in sections.items()}


def apply_preset(preset: str | Path, params_file: str | Path = params_mod.DEFAULT_PARAMS_FILE,
                 on_top: bool = True) -> dict[str, Any]:
    """Write `preset` merged over `params_file`'s values (on_top, `vlmgym preset --on-top`) or over the defaults (not
    on_top, what `vlmgym preset` does) to `params_file` (validated first); returns the validated sections."""
    return apply_overlay(params_mod.read_yaml(preset), params_file, what=str(preset), on_top=on_top)


def apply_overlay(overlay: Mapping[str, Any], params_file: str | Path = params_mod.DEFAULT_PARAMS_FILE,
                  what: str = "the overlay", on_top: bool = True) -> dict[str, Any]:
    """Write a partial params mapping merged over `params_file`'s values or the defaults (see apply_preset)."""
    params_file = Path(params_file)
    if on_top:
        raw = params_mod.merged_params(params_mod.read_params_file(params_file), dict(overlay), str(params_file), what)
        return params_mod.write_params(raw, params_file, what)
    if not params_file.exists():  # its leading comment is kept, and a mistyped --params creates nothing
        raise params_mod.ParamsError(f"{params_file}: params file not found")
    raw = params_mod.merged_params(defaults(), dict(overlay), "the defaults", what)
    return params_mod.write_params(raw, params_file, f"{what} over the defaults")


def file_values(params_file: str | Path) -> dict[str, Any]:
    """The file's values as a stage reads them (defaults filled in, aliases resolved), to tell what a preset changed;
    its own mapping where it does not load, since a preset over the defaults may replace a broken file."""
    try:
        return values(params_mod.load_all(params_file))
    except params_mod.ParamsError:
        return params_mod.read_yaml(params_file)


def _shown(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """`key: old -> new` for each key whose value differs; a sub-mapping only one side holds (an env's own section)
    is one line, `key: removed` or `key: added`."""
    old, new = dict(paths(before)), dict(paths(after))
    lines: dict[tuple[str, ...], str] = {}
    for path in [*new, *(p for p in old if p not in new)]:
        if path in old and path in new:
            if old[path] != new[path]:
                lines[path] = f"{_shown(old[path])} -> {_shown(new[path])}"
            continue
        lacking = old if path in new else new
        top = next(path[:i] for i in range(1, len(path) + 1) if not any(p[:i] == path[:i] for p in lacking))
        lines[top] = "added" if path in new else "removed"
    return [f"{'.'.join(path)}: {text}" for path, text in lines.items()]


def report(params_file: str | Path, subject: str, on_top: bool, changed: list[str]) -> str:
    """What a preset or recipe did to the params file: over what it was applied, and every key it changed."""
    how = ("merged over its values (--on-top)" if on_top else
           "over the defaults\n  (a key it leaves out is at its default, even one set by hand such as "
           "tracking.tracking_uri; --on-top keeps the file's values)")
    head = f"{params_file}: {subject} {how}\n"
    if not changed:
        return f"{head}no key changed"
    return f"{head}{len(changed)} key(s) changed from the file's previous values:\n" + "\n".join(
        f"  {line}" for line in changed)


def main(argv: list[str]) -> int:
    """`vlmgym preset FILE [--on-top] [--params params.yaml]`: write a preset over the defaults (or the params
    file's values) into the params file, printing the keys it changed."""
    parser = argparse.ArgumentParser(prog="vlmgym preset", description=main.__doc__)
    parser.add_argument("preset", help="partial params file, e.g. configs/micro.yaml")
    parser.add_argument("--params", default=str(params_mod.DEFAULT_PARAMS_FILE), help="params file rewritten")
    parser.add_argument("--on-top", action="store_true",
                        help="merge over the params file's values (a preset on another) instead of the defaults")
    args = parser.parse_args(argv)
    try:
        before = file_values(args.params)
        sections = apply_preset(args.preset, args.params, on_top=args.on_top)
    except params_mod.ParamsError as err:
        print(f"error: {err}")
        return 1
    print(report(args.params, args.preset, args.on_top, changes(before, values(sections))))
    return 0
