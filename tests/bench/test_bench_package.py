"""The benchmarks live in vlmgym.bench alone: every table entry resolves, and no other module imports them."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from vlmgym.bench import BENCHMARKS

REPO = Path(__file__).resolve().parents[2]


def test_every_benchmark_entry_resolves():
    for target, _ in BENCHMARKS.values():
        module, func = target.split(":")
        assert module.startswith("vlmgym.bench.") and callable(getattr(importlib.import_module(module), func))


def test_nothing_outside_bench_imports_it():
    # Editing a benchmark must not change any pipeline stage's code (nor its DVC deps).
    importer = re.compile(r"^\s*(from vlmgym\.bench\b|import vlmgym\.bench\b|from vlmgym import bench\b)", re.M)
    bench = REPO / "src" / "vlmgym" / "bench"
    outside = [p for folder in (REPO / "src", REPO / "stages") for p in folder.rglob("*.py")
               if bench not in p.parents and importer.search(p.read_text())]
    assert outside == []
