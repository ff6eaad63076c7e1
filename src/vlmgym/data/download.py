"""The download stage's library: the env's raw layout for `data.source` (its generator or its hub loader),
written atomically."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlmgym.config.sections import DataParams
from vlmgym.data import layout
from vlmgym.runtime.atomic import atomic_dir


# env is an Env class, typed Any: vlmgym.envs imports this package, which imports nothing above it.
def build_raw(params: DataParams, env: Any, raw_dir: Path | None = None,
              builder: Callable[[DataParams, Path], Any] | None = None) -> dict:
    """Write env's raw layout (an Env class; `builder` replaces its Env.build_raw) to a temp folder and rename it
    onto raw_dir; returns stats (counts, bytes, seconds)."""
    raw_dir = Path(raw_dir or params.raw_dir)
    builder = builder or env.build_raw
    start = time.perf_counter()
    with atomic_dir(raw_dir) as tmp:
        details = builder(params, tmp) or {}
        missing = [split for split in layout.SPLITS if not layout.csv_path(tmp, split).exists()]
        if missing:
            raise RuntimeError(f"raw builder for {env.name}/{params.source} wrote no CSV for split(s) {missing}")
        stats = {"dataset": env.name, "source": params.source, "details": details}
        for split in layout.present_splits(tmp):
            stats[f"{split}_rows"] = sum(1 for _ in layout.iter_csv(layout.csv_path(tmp, split)))
            stats[f"{split}_zips"] = len(layout.split_zips(tmp, split))
        stats["bytes"] = layout.tree_bytes(tmp)
    stats["seconds"] = time.perf_counter() - start
    return stats


def build_raw_parts(params: DataParams, parts: dict[str, Any], raw_dir: Path | None = None) -> dict:
    """The raw layouts of several envs (the sub-envs of one made of several: {name: Env class}), each in
    raw_dir/<name>/ as build_raw writes it, and parts.json listing them, swapped in as one folder; returns
    {"parts": {name: its stats}}."""
    import json

    raw_dir = Path(raw_dir or params.raw_dir)
    start = time.perf_counter()
    with atomic_dir(raw_dir) as tmp:
        stats = {name: build_raw(params, env, raw_dir=tmp / name) for name, env in parts.items()}
        (tmp / "parts.json").write_text(json.dumps({"parts": list(parts)}, indent=1) + "\n")
    return {"dataset": "+".join(parts), "source": params.source, "parts": stats,
            "seconds": time.perf_counter() - start}


def build_raw_envs(params: DataParams, envs: dict[str, Any], raw_dir: Path | None = None) -> dict:
    """The raw layout of the configured env's envs ({name: Env class}: vlmgym.envs.parts): one env's own layout in
    raw_dir (build_raw), or, for several (an env made of several), each one's in raw_dir/<name>/
    (build_raw_parts); returns their stats."""
    if len(envs) == 1:
        return build_raw(params, next(iter(envs.values())), raw_dir=raw_dir)
    return build_raw_parts(params, envs, raw_dir=raw_dir)

def numeric_metrics(stats: dict, prefix: str = "") -> dict[str, float]:
    """The numbers in a nested stats dict, flattened to MLflow metric names."""
    out: dict[str, float] = {}
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(numeric_metrics(value, f"{name}."))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out
