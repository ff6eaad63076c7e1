"""The machinery of typed, validated params sections: `spec` fields with bounds and docs, `from_dict` (keys,
types, ranges, the envs' own sections) and `to_dict`. Imports nothing else of vlmgym: a section that names envs is
validated with the env lookups its caller passes in (`envs`, see EnvLookup)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import types
import typing
from dataclasses import field
from typing import Any, TypeVar

T = TypeVar("T")
_FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


class ParamsError(ValueError):
    """A params file has an unknown key, a wrong type or an out-of-range value."""


def spec(default: Any = dataclasses.MISSING, *, ge=None, gt=None, le=None, lt=None, choices=None,
         doc: str = "", default_factory: Any = dataclasses.MISSING, env_sections: str | None = None,
         env_name: bool = False, aliases: tuple[str, ...] = (), value_aliases: dict[str, Any] | None = None,
         flat_aliases: bool = False) -> Any:
    """A dataclass field with validation bounds and a one-line description.

    env_sections="Params": the field holds the envs' own sections ({env name: dataclass}), written in the file
    as keys beside the section's other keys and validated by that env class's attribute of that name.
    env_name=True: the value must name an env (registered, an entry point or 'package.module:Class').
    aliases: other names the file may use for the key (e.g. TRL's); value_aliases: other spellings of values, the
    whole value or each item of a list (e.g. PEFT's module names). Both become the canonical ones on reading.
    flat_aliases=True (a sub-section): each of its keys, under its name or an alias, may also be written in the
    holding section itself, as another name for `<field>.<key>`: the layout of files written before those keys
    moved into the sub-section (train.beta for train.objective.beta).
    """
    meta = {"ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "doc": doc, "env_sections": env_sections,
            "env_name": env_name, "aliases": tuple(aliases), "value_aliases": dict(value_aliases or {}),
            "flat_aliases": flat_aliases}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


class EnvLookup(typing.Protocol):
    """What validating a section that names envs needs to know of them (vlmgym.envs.registry is one). The layer
    above the envs passes it to from_dict: this package is below them and never looks them up itself."""

    def env_class(self, name: str) -> type: ...

    def is_known(self, name: str) -> bool: ...

    def names(self) -> list[str]: ...


def from_dict(cls: type[T], raw: dict[str, Any], where: str = "params", envs: EnvLookup | None = None) -> T:
    """Build dataclass `cls` from `raw`, validating keys, types and ranges, and the fields that name envs or hold
    their sections (see spec) through `envs`."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    raw = canonical_keys(cls, raw, where)
    plugin = env_sections_field(cls)
    plain = {k: v for k, v in raw.items() if k in fields and (plugin is None or k != plugin.name)}
    extra = [k for k in raw if k not in plain]
    if extra and plugin is None:
        raise ParamsError(f"{where}.{extra[0]}: unknown key (value {raw[extra[0]]!r}); "
                          f"known keys: {', '.join(fields)}")
    values = {}
    for key, value in plain.items():
        f = fields[key]
        key_where = f"{where}.{key}"
        if isinstance(value, dict) and dataclasses.is_dataclass(hints[key]):
            value = _with_section_defaults(f, hints[key], value, key_where)
        value = _coerce(canonical_value(value, f.metadata.get("value_aliases")), hints[key], key_where, envs)
        _check_range(value, f.metadata, key_where)
        if f.metadata.get("env_name"):
            checked_env_class(value, key_where, envs)
        values[key] = value
    if plugin is not None:
        known = [k for k in fields if k != plugin.name]
        values[plugin.name] = {str(k): _env_section(str(k), raw[k], plugin.metadata["env_sections"], f"{where}.{k}",
                                                    known, envs) for k in extra}
    try:
        return cls(**values)
    except ParamsError as err:  # a check across keys (__post_init__): name the file too
        prefix = where.rsplit(": ", 1)[0] if ": " in where else where
        raise ParamsError(f"{prefix}: {err}") from err


def _with_section_defaults(f: dataclasses.Field, hint: type, value: dict[str, Any], where: str) -> dict[str, Any]:
    """A sub-section's keys over the holding section's defaults for it (sft's optimizer lr is not train's): a key
    the file leaves out keeps the default that the holding section gives, not the sub-section class's own."""
    if f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
        return value
    default = f.default_factory()  # type: ignore[misc]
    return {**to_dict(default), **canonical_keys(hint, value, where)}


def canonical_keys(cls: type, raw: dict[str, Any], where: str) -> dict[str, Any]:
    """`raw` with every key alias (spec's aliases) renamed to its field and every key of a sub-section read flat
    (spec's flat_aliases) moved into that sub-section's mapping; a key given under two names is an error naming
    both."""
    out = dict(raw)
    for alias, name in _alias_names(cls).items():
        if alias in out:
            if name in out:
                raise ParamsError(f"{where}.{alias} is another name for {name}: give one of them")
            out[name] = out.pop(alias)
    for holder, sub in _flat_sub_sections(cls):
        sub_names = _key_names(sub)
        flat = {key: out.pop(key) for key in list(out) if key in sub_names}
        if flat:
            out[holder] = _with_flat_keys(sub, out.get(holder), flat, where, holder)
    return out


def other_names_first(cls: type, raw: dict[str, Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """`raw` (a section of the pipeline's params file) with every key given under two names reduced to one: the
    name the file is not written under (an alias, a sub-section key written flat) wins and the other is dropped,
    at any depth; returns it and a line per key replaced. vlmgym writes params files under the canonical nested
    names only, so the other name was set on top of it, as `dvc exp run -S +train.num_generations=4` does beside
    train.group_size. Two other names of one key stay an error (canonical_keys): neither was the file's own."""
    out = dict(raw)
    notes: list[str] = []
    section = where.rsplit(": ", 1)[-1]
    for alias, name in _alias_names(cls).items():
        if alias in out and name in out:
            notes.append(f"{section}.{alias}: {out[alias]!r} replaces {section}.{name}: {out.pop(name)!r}")
    for holder, sub in _flat_sub_sections(cls):
        nested = out.get(holder)
        flat = [key for key in out if key in _key_names(sub)]
        if not flat or not isinstance(nested, dict):
            continue
        aliases = _alias_names(sub)
        flat_names = {aliases.get(key, key) for key in flat}
        nested = dict(nested)
        for key in [key for key in nested if aliases.get(key, key) in flat_names]:
            flat_key = next(k for k in flat if aliases.get(k, k) == aliases.get(key, key))
            notes.append(f"{section}.{flat_key}: {out[flat_key]!r} replaces {section}.{holder}.{key}: "
                         f"{nested.pop(key)!r}")
        out[holder] = nested
    hints = typing.get_type_hints(cls)
    for key, value in out.items():
        if isinstance(value, dict) and dataclasses.is_dataclass(hints.get(key)):
            out[key], inner = other_names_first(hints[key], value, f"{where}.{key}")
            notes += inner
    return out, notes


@functools.cache
def _flat_sub_sections(cls: type) -> tuple[tuple[str, type], ...]:
    """(field, sub-section class) of each sub-section of `cls` whose keys the file may also write flat."""
    hints = typing.get_type_hints(cls)
    out = tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.metadata.get("flat_aliases"))
    own = {f.name for f in dataclasses.fields(cls)} | set(_alias_names(cls))
    for holder, sub in out:
        clash = own & _key_names(sub)
        if clash:  # a flat key would be two keys at once: the section's own and the sub-section's
            raise TypeError(f"{cls.__name__}.{holder}: flat_aliases but {sorted(clash)} are keys of both")
    return out


def _alias_names(cls: type) -> dict[str, str]:
    """{alias: field} of the spec aliases of `cls`'s own fields."""
    return {alias: f.name for f in dataclasses.fields(cls) for alias in f.metadata.get("aliases", ())}


@functools.cache
def _key_names(cls: type) -> frozenset[str]:
    """Every name a key of section `cls` may be written under: its fields and their aliases."""
    return frozenset({f.name for f in dataclasses.fields(cls)} | set(_alias_names(cls)))


def _with_flat_keys(sub: type, nested: Any, flat: dict[str, Any], where: str, holder: str) -> dict[str, Any]:
    """The mapping of sub-section `holder` with its keys that the holding section gave flat added; a key given both
    flat and in the sub-section is an error naming both spellings."""
    if nested is None:
        nested = {}
    if not isinstance(nested, dict):
        raise ParamsError(f"{where}.{holder}: expected a mapping, got {nested!r}")
    flat_keys = canonical_keys(sub, flat, where)  # two flat spellings of one key: an error here already
    aliases = _alias_names(sub)
    flat_given = {aliases.get(k, k): k for k in flat}
    nested_given = {aliases.get(k, k): k for k in nested}
    section = where.rsplit(": ", 1)[-1]  # the key's path without the file's name, which `where` starts with
    for key in flat_keys:
        if key in nested_given:
            raise ParamsError(f"{where}.{flat_given[key]} is another name for {section}.{holder}.{nested_given[key]}: "
                              "give one of them")
    return {**nested, **flat_keys}


def canonical_value(value: Any, aliases: dict[str, Any] | None) -> Any:
    """A value with its spec value_aliases replaced: the whole value, or each item of a list."""
    if not aliases:
        return value
    if isinstance(value, str):
        return copy.deepcopy(aliases.get(value, value))
    if isinstance(value, list):
        return [aliases.get(item, item) if isinstance(item, str) else item for item in value]
    return value


def use_canonical_values(section: Any) -> None:
    """Replace a section's aliased values (spec's value_aliases) in place, from its __post_init__: a section built
    in code (`TrainParams(algorithm="dpo")`, `dataclasses.replace`) reads as one loaded from a file."""
    for f in dataclasses.fields(section):
        aliases = f.metadata.get("value_aliases")
        if aliases:
            object.__setattr__(section, f.name, canonical_value(getattr(section, f.name), aliases))


def with_values(section: T, values: dict[str, Any]) -> T:
    """`section` with the values of dotted keys replaced (`{"optimizer.lr": 3e-5, "steps": 10}`), sub-sections
    copied with their other values kept."""
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        head, dot, rest = key.partition(".")
        if dot:
            nested.setdefault(head, {})[rest] = value
        else:
            top[key] = value
    for head, inner in nested.items():
        top[head] = with_values(top.get(head, getattr(section, head)), inner)
    return dataclasses.replace(section, **top)  # type: ignore[type-var]


def canonical_paths(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
    """Dotted keys of section `cls` with every alias, at any depth, renamed to its field and every key of a
    sub-section read flat (spec's flat_aliases) given its sub-section's path (values unchanged); two keys naming the
    same one are an error."""
    hints = typing.get_type_hints(cls)
    aliases = _alias_names(cls)
    flat = {name: holder for holder, sub in _flat_sub_sections(cls) for name in _key_names(sub)}
    section = where.rsplit(": ", 1)[-1]  # the keys' path without the file's name, which `where` may start with
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in values.items():
        head, dot, rest = key.partition(".")
        if head in flat:  # the key of a sub-section, written flat: its path in the sub-section
            head, dot, rest = flat[head], ".", f"{head}{dot}{rest}"
        name = aliases.get(head, head)
        if dot and dataclasses.is_dataclass(hints.get(name)):
            (inner,) = canonical_paths(hints[name], {rest: value}, f"{where}.{name}")
            path = f"{name}.{inner}"
        else:
            path = f"{name}{dot}{rest}"
        if path in given:
            alias, other = (given[path], key) if key == path else (key, given[path])
            raise ParamsError(f"{where}.{alias} is another name for {section}.{other}: give one of them")
        given[path] = key
        out[path] = value
    return out


def canonical_tree(cls: type, raw: dict[str, Any], where: str) -> dict[str, Any]:
    """A mapping of section `cls` as a file holds it, with every key alias at any depth renamed to its field (values
    unchanged); keys that are not fields (an env's own section) are left as they are."""
    hints = typing.get_type_hints(cls)
    out = canonical_keys(cls, raw, where)
    for key, value in out.items():
        if isinstance(value, dict) and dataclasses.is_dataclass(hints.get(key)):
            out[key] = canonical_tree(hints[key], value, f"{where}.{key}")
    return out


def value_at(section: Any, key: str) -> Any:
    """The value of a dotted key of a section."""
    for part in key.split("."):
        section = getattr(section, part)
    return section


def nested_keys(values: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys as nested mappings: {"optimizer.lr": 1} -> {"optimizer": {"lr": 1}}."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        *heads, last = key.split(".")
        node = out
        for head in heads:
            node = node.setdefault(head, {})
        node[last] = value
    return out


def merged(base: typing.Mapping[str, Any], over: typing.Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `over` merged in: nested mappings recursively, everything else replaced."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, typing.Mapping) and isinstance(out.get(key), typing.Mapping)
        out[key] = merged(out[key], value) if both else value
    return out


def to_dict(section: Any) -> dict[str, Any]:
    """A section as a plain dict, as the file writes it (for logging): envs' sections under their names."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.metadata.get("env_sections"):
            out.update({name: to_dict(v) for name, v in value.items()})
        elif dataclasses.is_dataclass(value):
            out[f.name] = to_dict(value)
        else:
            out[f.name] = copy.deepcopy(value)
    return out


def env_sections_field(cls: type) -> dataclasses.Field | None:
    return next((f for f in dataclasses.fields(cls) if f.metadata.get("env_sections")), None)


def checked_env_class(name: Any, where: str, envs: EnvLookup | None) -> type:
    """The env class `name` resolves to through `envs`, its failure as a ParamsError naming the key."""
    lookup = _lookup(envs, where)
    try:
        return lookup.env_class(name)
    except (KeyError, ImportError, TypeError, ValueError) as err:
        raise ParamsError(f"{where}: {err.args[0] if err.args else err}") from err


def _lookup(envs: EnvLookup | None, where: str) -> EnvLookup:
    if envs is None:  # a caller's mistake, not the file's: it validated a section that names envs without them
        raise TypeError(f"{where} names envs: validate it with from_dict(..., envs=<the env registry>)")
    return envs


def _env_section(name: str, value: Any, attribute: str, where: str, known: list[str], envs: EnvLookup | None) -> Any:
    """An env's own section (env.<name>, data.<name>), validated by its dataclass `attribute` (Params, DataParams)."""
    lookup = _lookup(envs, where)
    if not lookup.is_known(name):
        raise ParamsError(f"{where}: unknown key (value {value!r}); known keys: {', '.join(known)}, or a section "
                          f"named after an env ({', '.join(lookup.names())})")
    section_cls = getattr(checked_env_class(name, where, lookup), attribute)
    if section_cls is None:
        raise ParamsError(f"{where}: env {name!r} takes no settings here (it declares no {attribute})")
    if not isinstance(value, dict):
        raise ParamsError(f"{where}: expected a mapping of {name}'s settings, got {value!r}")
    return from_dict(section_cls, value, where, lookup)


def _coerce(value: Any, hint: Any, where: str, envs: EnvLookup | None = None) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where, envs)
            except ParamsError:
                pass
        raise ParamsError(f"{where}: value {value!r} matches none of {hint}")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ParamsError(f"{where}: expected a list, got {value!r} ({type(value).__name__})")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]", envs) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"{where}: expected a mapping, got {value!r} ({type(value).__name__})")
        return {str(k): _coerce(v, args[1], f"{where}.{k}", envs) if args else v for k, v in value.items()}
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{where}: expected true/false, got {value!r} ({type(value).__name__})")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"{where}: expected an integer, got {value!r} ({type(value).__name__})")
        return value
    if hint is float:
        # PyYAML follows YAML 1.1, which reads `3e-5` (no dot) as a string; DVC writes `-S train.optimizer.lr=3e-5` so.
        if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ParamsError(f"{where}: expected a number, got {value!r} ({type(value).__name__})")
        return _finite(float(value), where)
    if hint is str:
        if not isinstance(value, str):
            raise ParamsError(f"{where}: expected a string, got {value!r} ({type(value).__name__})")
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ParamsError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(hint, value, where, envs)
    raise ParamsError(f"{where}: unsupported type {hint}")


def _finite(value: float, where: str) -> float:
    """Every float of a params file passes here: YAML reads `.inf` and `.nan` as numbers, and an lr of inf trains
    a model of NaNs without any other error."""
    if not math.isfinite(value):
        raise ParamsError(f"{where}: value {value!r} is not a finite number (inf and nan are refused); give a "
                          "finite one")
    return value


def _check_range(value: Any, meta: typing.Mapping, where: str) -> None:
    items = value if isinstance(value, list | tuple) else [value]
    for v in items:
        if meta.get("choices") is not None and v not in meta["choices"]:
            raise ParamsError(f"{where}: value {v!r} is not one of {list(meta['choices'])}")
        if not isinstance(v, int | float) or isinstance(v, bool):
            continue
        for bound, word, ok in (("ge", ">=", lambda a, b: a >= b), ("gt", ">", lambda a, b: a > b),
                                ("le", "<=", lambda a, b: a <= b), ("lt", "<", lambda a, b: a < b)):
            limit = meta.get(bound)
            if limit is not None and not ok(v, limit):
                raise ParamsError(f"{where}: value {v!r} out of range (must be {word} {limit})")
