"""The download stage's library: build the raw layout for (data.dataset, data.source), atomically."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlmgym.data import layout
from vlmgym.params import DataParams


def raw_builder(params: DataParams) -> Callable[[DataParams, Path], Any]:
    """The function that writes the raw layout for this dataset and source into a folder."""
    if params.dataset == "geospot":
        if params.source == "synthetic":
            from vlmgym.data.synthetic import write_synthetic_raw

            return write_synthetic_raw
        from vlmgym.data.osv5m import download_hub_raw

        return download_hub_raw
    if params.dataset == "nlvr2":
        from vlmgym.data import nlvr2

        return nlvr2.write_synthetic_raw if params.source == "synthetic" else nlvr2.download_hub_raw
    raise ValueError(f"data.dataset: no raw builder for {params.dataset!r}")


def build_raw(params: DataParams, raw_dir: Path | None = None,
              builder: Callable[[DataParams, Path], Any] | None = None) -> dict:
    """Write the raw layout to a temp folder and rename it onto raw_dir; returns stats (counts, bytes, seconds)."""
    raw_dir = Path(raw_dir or params.raw_dir)
    builder = builder or raw_builder(params)
    start = time.perf_counter()
    with layout.atomic_dir(raw_dir) as tmp:
        details = builder(params, tmp) or {}
        missing = [split for split in layout.SPLITS if not layout.csv_path(tmp, split).exists()]
        if missing:
            raise RuntimeError(f"raw builder for {params.dataset}/{params.source} wrote no CSV for split(s) {missing}")
        stats = {"dataset": params.dataset, "source": params.source, "details": details}
        for split in layout.SPLITS:
            stats[f"{split}_rows"] = sum(1 for _ in layout.iter_csv(layout.csv_path(tmp, split)))
            stats[f"{split}_zips"] = len(layout.split_zips(tmp, split))
        stats["bytes"] = layout.tree_bytes(tmp)
    stats["seconds"] = time.perf_counter() - start
    return stats


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
