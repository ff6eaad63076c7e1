"""Typed, validated sections of params.yaml.

Each pipeline stage reads one section into a frozen dataclass. Unknown keys,
wrong types and out-of-range values raise ParamsError naming the key, the value
and the file, so a typo in `dvc exp run -S ...` fails loudly instead of being
silently ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

DEFAULT_PARAMS_FILE = Path("params.yaml")

T = TypeVar("T")


class ParamsError(ValueError):
    """A params file has an unknown key, a wrong type or an out-of-range value."""


def spec(default: Any = dataclasses.MISSING, *, ge=None, gt=None, le=None, lt=None, choices=None,
         doc: str = "", default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with validation bounds and a one-line description."""
    meta = {"ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "doc": doc}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


# --- sections -----------------------------------------------------------------


@dataclass(frozen=True)
class DataParams:
    """download stage: where the raw OSV-5M-layout data comes from."""

    dataset: str = spec("geospot", choices=("geospot", "nlvr2"), doc="which environment's data to build")
    source: str = spec("synthetic", choices=("synthetic", "hub"),
                       doc="synthetic generator (offline default) or the real dataset from the Hugging Face hub")
    seed: int = spec(0, ge=0, doc="seed of the synthetic generators")
    countries: list[str] = spec(default_factory=list, doc="ISO-2 codes of the synthetic world (empty: num_countries)")
    num_countries: int = spec(8, ge=1, le=250, doc="countries picked when `countries` is empty")
    train_images: int = spec(2000, ge=1, doc="synthetic train images")
    test_images: int = spec(200, ge=1, doc="synthetic test images")
    image_width: int = spec(256, ge=32, le=4096, doc="width of rendered synthetic images")
    image_height: int = spec(192, ge=32, le=4096, doc="height of rendered synthetic images")
    hub_repo: str = spec("", doc="hub dataset repo for source=hub (empty: osv5m/osv5m or HuggingFaceM4/NLVR2)")
    zips_per_split: int = spec(1, ge=1, le=98, doc="image zips downloaded per split for source=hub")
    hub_cache_dir: str = spec("data/hub_cache", doc="resumable download cache for source=hub (kept between runs)")
    cities_per_country: int = spec(12, ge=1, le=500, doc="anchor places per country of the synthetic world")
    jitter_km: float = spec(2.0, gt=0, le=50, doc="std-dev of the synthetic coordinates around their anchor place")
    raw_dir: str = spec("data/raw", doc="where the raw layout is written")


@dataclass(frozen=True)
class ShardParams:
    """shard stage: validation, resizing and webdataset tar writing."""

    max_pixels: int = spec(256 * 192, ge=32 * 32, doc="images larger than this many pixels are downscaled")
    shard_max_bytes: int = spec(64 * 1024 * 1024, ge=1024, doc="target size of one tar")
    jpeg_quality: int = spec(90, ge=1, le=100, doc="JPEG quality of re-encoded images")
    max_train: int = spec(0, ge=0, doc="cap on train samples (0: all)")
    max_test: int = spec(0, ge=0, doc="cap on test samples (0: all)")
    out_dir: str = spec("data/shards", doc="shard output folder")


@dataclass(frozen=True)
class ModelParams:
    """base_model and convert stages."""

    source: str = spec("tiny", doc="'tiny' (random tiny Qwen3-VL built here) or 'hf:<repo>' (hub snapshot)")
    seed: int = spec(0, ge=0, doc="seed of the tiny model's random weights")
    dtype: str = spec("fp32", choices=("fp32", "bf16"), doc="compute dtype")
    param_dtype: str = spec("fp32", choices=("fp32", "bf16"), doc="parameter dtype")
    parity_tolerance: float = spec(1e-4, gt=0, doc="max abs logit difference accepted by the convert stage (fp32)")


@dataclass(frozen=True)
class TrackingParams:
    """MLflow tracking."""

    experiment: str = spec("vlmgym", doc="MLflow experiment name")
    tracking_uri: str = spec("", doc="empty: MLFLOW_TRACKING_URI if set, else sqlite:///mlflow.db in the repo")


@dataclass(frozen=True)
class EnvParams:
    """The environment the policy is trained and evaluated on."""

    name: str = spec("geospot", choices=("geospot", "nlvr2"), doc="registered environment name")


SECTIONS: dict[str, type] = {
    "data": DataParams,
    "shard": ShardParams,
    "model": ModelParams,
    "env": EnvParams,
    "tracking": TrackingParams,
}


# --- loading and validation ---------------------------------------------------


def read_yaml(path: str | Path = DEFAULT_PARAMS_FILE) -> dict[str, Any]:
    """Read a params file into a dict, with a clear error when it is not a mapping."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: params file not found")
    with path.open() as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return raw


def load_section(name: str, path: str | Path = DEFAULT_PARAMS_FILE, overrides: dict | None = None):
    """Load and validate one section of a params file (missing section: all defaults)."""
    if name not in SECTIONS:
        raise ParamsError(f"{path}: unknown section {name!r} (known: {', '.join(sorted(SECTIONS))})")
    raw = read_yaml(path).get(name) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: section {name!r} must be a mapping, got {raw!r}")
    raw = {**raw, **(overrides or {})}
    return from_dict(SECTIONS[name], raw, where=f"{path}: {name}")


def load_all(path: str | Path = DEFAULT_PARAMS_FILE) -> dict[str, Any]:
    """Load and validate every section; unknown sections are errors."""
    raw = read_yaml(path)
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ParamsError(f"{path}: unknown section(s) {unknown} (known: {', '.join(sorted(SECTIONS))})")
    return {name: load_section(name, path) for name in SECTIONS}


def from_dict(cls: type[T], raw: dict[str, Any], where: str = "params") -> T:
    """Build dataclass `cls` from `raw`, validating keys, types and ranges."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ParamsError(f"{where}.{unknown[0]}: unknown key (value {raw[unknown[0]]!r}); "
                          f"known keys: {', '.join(fields)}")
    values = {}
    for key, value in raw.items():
        f = fields[key]
        key_where = f"{where}.{key}"
        value = _coerce(value, hints[key], key_where)
        _check_range(value, f.metadata, key_where)
        values[key] = value
    return cls(**values)


def to_dict(section: Any) -> dict[str, Any]:
    """A section as a plain dict (for logging)."""
    return dataclasses.asdict(section)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ParamsError:
                pass
        raise ParamsError(f"{where}: value {value!r} matches none of {hint}")
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ParamsError(f"{where}: expected a list, got {value!r} ({type(value).__name__})")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"{where}: expected a mapping, got {value!r} ({type(value).__name__})")
        return {str(k): _coerce(v, args[1], f"{where}.{k}") if args else v for k, v in value.items()}
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
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ParamsError(f"{where}: expected a number, got {value!r} ({type(value).__name__})")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ParamsError(f"{where}: expected a string, got {value!r} ({type(value).__name__})")
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ParamsError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(hint, value, where)
    raise ParamsError(f"{where}: unsupported type {hint}")


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


def main(argv: list[str]) -> int:
    """`vlmgym params [FILE]`: validate a params file and print its sections with defaults filled in."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="vlmgym params", description=main.__doc__)
    parser.add_argument("file", nargs="?", default=str(DEFAULT_PARAMS_FILE))
    args = parser.parse_args(argv)
    try:
        sections = load_all(args.file)
    except ParamsError as e:
        print(f"error: {e}")
        return 1
    print(json.dumps({k: to_dict(v) for k, v in sections.items()}, indent=2))
    return 0
