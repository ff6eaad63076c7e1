"""Typed, validated sections of params.yaml, and `vlmgym params`.

The sections and their validation live in vlmgym.config (at the bottom of the house); this module is their face
for everything above the envs: importing it loads the env registry (vlmgym.envs), which validation looks env names
and the envs' own sections up in. It adds the defaults with the default env's sections filled in, params.yaml's
text with each key's doc, and the `vlmgym params` command.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from vlmgym.config import (  # noqa: F401  (re-exported: the names every stage and tool imports from here)
    DEFAULT_PARAMS_FILE,
    LORA_TEXT_TARGETS,
    REMAT_DOC,
    SECTIONS,
    DataParams,
    EnvParams,
    EvalParams,
    ExportParams,
    LoRAParams,
    ModelParams,
    ParamsError,
    RolloutParams,
    SFTParams,
    ShardParams,
    TrackingParams,
    TrainParams,
    from_dict,
    load_all,
    load_section,
    read_yaml,
    spec,
    to_dict,
)
from vlmgym.config.spec import merged, moved_to_their_places  # noqa: F401  (re-exported)
from vlmgym.envs import registry
from vlmgym.envs.registry import DEFAULT_ENV
from vlmgym.runtime.atomic import atomic_file


def default_sections() -> dict[str, Any]:
    """Every section at its defaults, with the default env's own sections filled in (what params.yaml shows)."""
    cls = registry.env_class(DEFAULT_ENV)
    sections: dict[str, Any] = {name: section() for name, section in SECTIONS.items()}
    if cls.DataParams is not None:
        sections["data"] = DataParams(sections={cls.name: cls.DataParams()})
    if cls.Params is not None:
        sections["env"] = EnvParams(sections={cls.name: cls.Params()})
    return sections


def render_yaml(sections: dict[str, Any] | None = None) -> str:
    """params.yaml text for the given section objects (default: all defaults), each key with its doc as a comment."""
    sections = sections or default_sections()
    lines: list[str] = []

    def emit(obj: Any, indent: int) -> None:
        pad = "  " * indent
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get("env_sections"):
                for name, section in value.items():
                    lines.append(f"{pad}{name}:  # {type(section).__doc__.strip().splitlines()[0]}")
                    emit(section, indent + 1)
                continue
            if dataclasses.is_dataclass(value):
                doc = f.metadata.get("doc", "")
                lines.append(f"{pad}{f.name}:" + (f"  # {doc}" if doc else ""))
                emit(value, indent + 1)
                continue
            text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
            text = text.removesuffix("\n...").strip()
            doc = f.metadata.get("doc", "")
            lines.append(f"{pad}{f.name}: {text}" + (f"  # {doc}" if doc else ""))

    for name, obj in sections.items():
        lines.append(f"{name}:  # {type(obj).__doc__.strip().splitlines()[0]}")
        emit(obj, 1)
        lines.append("")
    return "\n".join(lines)


def write_params(raw: dict[str, Any], params_file: str | Path, what: str) -> dict[str, Any]:
    """Replace `params_file` with the sections of `raw`, validated first (from the temp file itself: the file is
    replaced only when it loads), each key with its doc, the file's leading comment kept; returns the sections."""
    params_file = Path(params_file)
    lines = params_file.read_text().splitlines()
    header = "".join(f"{line}\n" for line in lines[: next((i for i, x in enumerate(lines) if not x.startswith("#")),
                                                           len(lines))])
    with atomic_file(params_file) as tmp:
        tmp.write_text(yaml.safe_dump(raw, sort_keys=False))
        try:
            sections = load_all(tmp)
        except ParamsError as err:
            raise ParamsError(f"{what} merged into {params_file}: {err}") from err
        tmp.write_text(header + ("\n" if header else "") + render_yaml(sections))
    return sections


def upgraded(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A params file's mapping with the keys of the older, flat layout (`train.lr`, `sft.val_every`, ...) moved to
    their sub-sections (`train.optimizer.lr`, `sft.validation.every`), and the list of what moved."""
    out, moves = dict(raw), []
    for name, cls in SECTIONS.items():
        if isinstance(out.get(name), dict):
            out[name], moved = moved_to_their_places(cls, out[name], name)
            moves += moved
    return out, moves


def upgrade_file(path: str | Path) -> list[str]:
    """Rewrite a params file in the current layout (validated, atomically, each key with its doc); returns what
    moved. A file already in it is rewritten only in form."""
    raw, moves = upgraded(read_yaml(path))
    write_params(raw, path, "the upgraded keys")
    return moves


def main(argv: list[str]) -> int:
    """`vlmgym params [FILE]`: validate a params file and print its sections with defaults filled in."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="vlmgym params", description=main.__doc__)
    parser.add_argument("file", nargs="?", default=str(DEFAULT_PARAMS_FILE))
    parser.add_argument("--yaml", action="store_true", help="print the sections as params.yaml text with docs")
    parser.add_argument("--upgrade", action="store_true",
                        help="rewrite the file with the keys of the older flat layout moved to their sub-sections")
    args = parser.parse_args(argv)
    try:
        if args.upgrade:
            moves = upgrade_file(args.file)
            print("\n".join([f"{args.file}: {len(moves)} key(s) moved", *moves]))
            return 0
        sections = load_all(args.file)
    except ParamsError as e:
        print(f"error: {e}")
        return 1
    print(render_yaml(sections) if args.yaml else json.dumps({k: to_dict(v) for k, v in sections.items()}, indent=2))
    return 0
