"""params.yaml: its typed, validated sections, reading a params file, and `vlmgym params`.

The one place everything above the envs imports params from. The sections' machinery lives beneath the envs in
vlmgym.config, which knows no env; this module adds the `env` section (vlmgym.envs.registry.EnvParams) and reads a
params file with the env registry passed to validation, which looks env names and the envs' own sections
(`env.<name>`, `data.<name>`) up in it. It also gives the defaults with the default env's sections filled in,
params.yaml's text with each key's doc, and the `vlmgym params` command.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path
from typing import Any, TypeVar

import yaml

from vlmgym.config.sections import (
    LORA_TEXT_TARGETS,
    REMAT_DOC,
    DataParams,
    EvalParams,
    ExportParams,
    LoRAParams,
    ModelParams,
    ObjectiveParams,
    PerceptionParams,
    RolloutParams,
    SFTParams,
    ShardParams,
    TrackingParams,
    TrainParams,
)
from vlmgym.config.spec import (
    ParamsError,
    canonical_paths,
    canonical_tree,
    checked_env_class,
    env_sections_field,
    merged,
    nested_keys,
    other_names_first,
    spec,
    to_dict,
    value_at,
    with_values,
)
from vlmgym.config.spec import from_dict as validated
from vlmgym.envs import registry
from vlmgym.envs.registry import DEFAULT_ENV, EnvParams
from vlmgym.runtime.atomic import atomic_file

__all__ = ["DEFAULT_PARAMS_FILE", "LORA_TEXT_TARGETS", "REMAT_DOC", "SECTIONS", "DataParams", "EnvParams", "EvalParams",
           "ExportParams", "LoRAParams", "ModelParams", "ObjectiveParams", "ParamsError", "PerceptionParams",
           "RolloutParams", "SFTParams", "ShardParams", "TrackingParams", "TrainParams", "canonical_paths",
           "default_sections", "from_dict", "load_all", "load_section", "main", "merged", "merged_params",
           "nested_keys", "read_params_file", "read_yaml", "render_yaml", "spec", "to_dict", "value_at", "with_values",
           "write_params"]

T = TypeVar("T")
DEFAULT_PARAMS_FILE = Path("params.yaml")
SECTIONS: dict[str, type] = {
    "data": DataParams,
    "shard": ShardParams,
    "model": ModelParams,
    "env": EnvParams,
    "tracking": TrackingParams,
    "sft": SFTParams,
    "train": TrainParams,
    "rollout": RolloutParams,
    "export": ExportParams,
    "eval": EvalParams,
}


def from_dict(cls: type[T], raw: dict[str, Any], where: str = "params") -> T:
    """Build section `cls` from `raw`, validating keys, types and ranges, env names and the envs' own sections."""
    return validated(cls, raw, where, envs=registry)


# PyYAML's C parser where it is built (same values: the resolvers and constructors are the Python ones), ~10x
# faster on params.yaml's comments: every stage reads the whole file.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: str | Path = DEFAULT_PARAMS_FILE) -> dict[str, Any]:
    """Read a params file into a dict, with a clear error when it is not a mapping."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: params file not found")
    return _mapping(path.read_bytes(), path)


def _mapping(data: bytes, path: str | Path) -> dict[str, Any]:
    raw = yaml.load(data, Loader=_YAML_LOADER) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return raw


def read_params_file(path: str | Path = DEFAULT_PARAMS_FILE) -> dict[str, Any]:
    """Read the pipeline's params file as read_yaml does, a key set on top under another of its names (TRL's, or
    the flat layout: `dvc exp run -S +train.num_generations=4`) replacing the one the file holds (see
    other_names_first), with a line on stderr for each."""
    path = Path(path)
    return _own_names_replaced(read_yaml(path), path)


def _own_names_replaced(raw: dict[str, Any], path: str | Path) -> dict[str, Any]:
    out = dict(raw)
    for name, value in raw.items():
        if name in SECTIONS and isinstance(value, dict):
            out[name], notes = other_names_first(SECTIONS[name], value, f"{path}: {name}")
            for note in notes:
                print(f"{path}: {note}", file=sys.stderr)
    return out


def load_section(name: str, path: str | Path = DEFAULT_PARAMS_FILE, overrides: dict | None = None):
    """Load and validate one section of a params file (missing section: all defaults).

    The whole file is validated first, as `vlmgym params` does: a stage refuses an unknown top-level key or a bad
    value in another section too, rather than running with a file the others refuse."""
    if name not in SECTIONS:
        raise ParamsError(f"{path}: unknown section {name!r} (known: {', '.join(sorted(SECTIONS))})")
    raw, sections = _validated_file(Path(path))
    if not overrides:
        return copy.deepcopy(sections[name])  # the cached object is shared: a caller may not change it
    return _section(name, raw, path, overrides)


def load_all(path: str | Path = DEFAULT_PARAMS_FILE) -> dict[str, Any]:
    """Load and validate every section; unknown sections are errors."""
    path = Path(path)
    return _all_sections(read_params_file(path), path)


def _all_sections(raw: dict[str, Any], path: str | Path) -> dict[str, Any]:
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ParamsError(f"{path}: unknown section(s) {unknown} (known: {', '.join(sorted(SECTIONS))})")
    return {name: _section(name, raw, path) for name in SECTIONS}


# Validated files by path and content: a stage loads three or four sections of one file, each validating it all.
_VALIDATED: dict[tuple[str, bytes], tuple[dict[str, Any], dict[str, Any]]] = {}


def _validated_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the file's mapping, every section validated), parsed and validated once per content."""
    if not path.exists():
        raise ParamsError(f"{path}: params file not found")
    data = path.read_bytes()
    key = (str(path.resolve()), data)
    if key not in _VALIDATED:
        raw = _own_names_replaced(_mapping(data, path), path)
        sections = _all_sections(raw, path)
        if len(_VALIDATED) >= 8:
            _VALIDATED.clear()
        _VALIDATED[key] = (raw, sections)
    return _VALIDATED[key]


def _section(name: str, file: dict[str, Any], path: str | Path, overrides: dict | None = None) -> Any:
    raw = file.get(name) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: section {name!r} must be a mapping, got {raw!r}")
    if overrides:
        # an override of one sub-section key keeps the file's others; the file's keys under their canonical names
        # first, so that an override of train.objective.beta replaces a file's flat train.beta, not joins it
        raw = merged(canonical_tree(SECTIONS[name], raw, f"{path}: {name}"), overrides)
    if name != "env" and env_sections_field(SECTIONS[name]) is not None:
        _resolve_active_env(file, path)  # so a 'package.module:Class' env's own section here is known
    return from_dict(SECTIONS[name], raw, where=f"{path}: {name}")


def _resolve_active_env(file: dict[str, Any], path: str | Path) -> None:
    env = file.get("env")
    name = env.get("name") if isinstance(env, dict) else None
    if isinstance(name, str):
        checked_env_class(name, f"{path}: env.name", registry)


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
    """params.yaml text for the given section objects (default: all defaults), each key with its doc as a comment.

    The text is what DVC's own YAML dumper writes back unchanged: `dvc exp run -S key=value` (and `dvc exp apply`)
    reloads the file with ruamel.yaml, replaces every list and scalar with a plain value and dumps it, so a list
    written in flow style comes back as a block list, a long string is folded at 80 columns and a blank line after
    a block list is dropped. Written in that form, setting one key changes one line of the file."""
    from dvc.utils.serialize import dumps_yaml  # only writers pay for importing DVC, not every stage reading params

    sections = sections or default_sections()
    lines: list[str] = []
    ends_in_block_list = False

    def emit(obj: Any, path: list[str]) -> None:
        nonlocal ends_in_block_list
        pad = "  " * len(path)
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get("env_sections"):
                for name, section in value.items():
                    lines.append(f"{pad}{name}:  # {type(section).__doc__.strip().splitlines()[0]}")
                    emit(section, [*path, name])
                continue
            doc = f.metadata.get("doc", "")
            if dataclasses.is_dataclass(value):
                lines.append(f"{pad}{f.name}:" + (f"  # {doc}" if doc else ""))
                emit(value, [*path, f.name])
                continue
            lines.extend(_leaf_lines(dumps_yaml, [*path, f.name], value, doc))
            ends_in_block_list = isinstance(value, list | tuple) and bool(value)

    for name, obj in sections.items():
        lines.append(f"{name}:  # {type(obj).__doc__.strip().splitlines()[0]}")
        ends_in_block_list = False
        emit(obj, [name])
        # ruamel keeps the blank line after a block list as a comment of the list's last item, lost when DVC puts a
        # plain list in its place: a blank line there would vanish on the first `dvc exp run -S`
        if not ends_in_block_list:
            lines.append("")
    return "\n".join(lines) + ("" if lines[-1] == "" else "\n")


def _leaf_lines(dump: Any, path: list[str], value: Any, doc: str) -> list[str]:
    """The lines of the key at `path` and its value, as `dump` (DVC's dumper) writes them in the whole file: the key
    is dumped inside its parents' keys so that it folds at the column it has there, and their lines are dropped."""
    from ruamel.yaml.comments import CommentedMap

    def dvc_form(v: Any) -> Any:
        # DVC merges into a mapping it loaded in place, so a flow mapping stays one (keys sorted, as PyYAML wrote
        # them before); a list it replaces with a plain one, which its dumper writes as a block list
        if isinstance(v, dict):
            flow = CommentedMap((k, dvc_form(x)) for k, x in sorted(v.items()))
            flow.fa.set_flow_style()
            return flow
        return [dvc_form(x) for x in v] if isinstance(v, list | tuple) else v

    def nest(v: Any) -> Any:
        for key in reversed(path):
            v = {key: v}
        return v

    text = dump(nest(dvc_form(value)))
    read = yaml.load(text, Loader=_YAML_LOADER)
    for key in path:
        read = read[key]
    block = isinstance(value, list | tuple) and bool(value)
    if not _reads_back(read, value):
        # ruamel writes YAML 1.2: `on` and `1:30` plain, 1e-05 with no dot, which PyYAML (YAML 1.1, vlmgym's
        # reader) reads as true, 90 and a string. Such a value is written as PyYAML writes it. DVC's -S keeps a
        # number's text as the file has it, so 1.0e-05 stays; such a string it writes again unquoted.
        text = yaml.safe_dump(nest(_plain(value)), default_flow_style=False)
        block = isinstance(value, list | tuple | dict) and bool(value)
    lines = text.splitlines()[len(path) - 1:]
    if doc:
        # a block collection's comment follows its key; a scalar folded over lines takes one after its last line
        lines[0 if block else -1] += f"  # {doc}"
    return lines


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(x) for k, x in value.items()}
    return [_plain(x) for x in value] if isinstance(value, list | tuple) else value


def _reads_back(read: Any, value: Any) -> bool:
    """Whether PyYAML reads a written value back as the value itself, type and all."""
    if isinstance(value, list | tuple):
        return isinstance(read, list) and len(read) == len(value) and all(map(_reads_back, read, value))
    if isinstance(value, dict):
        return isinstance(read, dict) and read.keys() == value.keys() and all(_reads_back(read[k], value[k])
                                                                              for k in value)
    return type(read) is type(value) and read == value


def merged_params(base: dict[str, Any], over: dict[str, Any], base_where: str, over_where: str) -> dict[str, Any]:
    """`over` (a preset, a recipe) merged into `base` (a params file's mapping) as `merged` does, with every key
    alias on both sides renamed to its key first: an alias in `over` (TRL's train.num_generations) then replaces the
    key `base` holds under vlmgym's name (group_size), where the two spellings merged as they are would both be kept,
    an error. A key and its alias together in one of them is an error naming it (base_where, over_where)."""
    return merged(_canonical_sections(base, base_where), _canonical_sections(over, over_where))


def _canonical_sections(raw: dict[str, Any], where: str) -> dict[str, Any]:
    # an unknown section or a section that is no mapping is left for validation to name
    return {name: canonical_tree(SECTIONS[name], value, f"{where}: {name}")
            if name in SECTIONS and isinstance(value, dict) else value for name, value in raw.items()}


def write_params(raw: dict[str, Any], params_file: str | Path, what: str) -> dict[str, Any]:
    """Replace `params_file` with the sections of `raw`, validated first (from the temp file itself: the file is
    replaced only when it loads), each key with its doc, the file's leading comment kept; returns the sections.
    An error names `what` and `params_file`, never the temp file."""
    params_file = Path(params_file)
    lines = params_file.read_text().splitlines()
    header = "".join(f"{line}\n" for line in lines[: next((i for i, x in enumerate(lines) if not x.startswith("#")),
                                                           len(lines))])
    with atomic_file(params_file) as tmp:
        tmp.write_text(yaml.safe_dump(raw, sort_keys=False))
        where = f"{what} merged into {params_file}"
        sections = _all_sections(_mapping(tmp.read_bytes(), where), where)
        tmp.write_text(header + ("\n" if header else "") + render_yaml(sections))
    return sections


def main(argv: list[str]) -> int:
    """`vlmgym params [FILE]`: validate a params file and print its sections with defaults filled in."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="vlmgym params", description=main.__doc__)
    parser.add_argument("file", nargs="?", default=str(DEFAULT_PARAMS_FILE))
    parser.add_argument("--yaml", action="store_true", help="print the sections as params.yaml text with docs")
    args = parser.parse_args(argv)
    try:
        sections = load_all(args.file)
    except ParamsError as e:
        print(f"error: {e}")
        return 1
    print(render_yaml(sections) if args.yaml else json.dumps({k: to_dict(v) for k, v in sections.items()}, indent=2))
    return 0
