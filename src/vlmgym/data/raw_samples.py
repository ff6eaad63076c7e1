"""Samples straight from a raw layout, in memory: what `Env.generate(n)` returns for tests and quick experiments."""

from __future__ import annotations

import io
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from PIL import Image

from vlmgym.config.sections import DataParams
from vlmgym.data import layout
from vlmgym.data.shard_writer import ShardError, read_rows
from vlmgym.data.shards import Sample


def read_raw_split(raw_dir: Path, split: str, schema: Any) -> list[Sample]:
    """Every valid row of a raw split as a Sample (images decoded to RGB, in the schema's order)."""
    index = layout.ZipIndex.build(layout.split_zips(raw_dir, split))
    skipped: Counter = Counter()
    rows = read_rows(raw_dir, split, schema, index, skipped, {})
    samples = []
    with layout.ZipReader() as zips:
        for row in rows:
            images = []
            for name in row.images:
                with Image.open(io.BytesIO(zips.read(*index.members[name]))) as image:
                    images.append(image.convert("RGB"))
            samples.append(Sample(key=row.key, images=images, meta=dict(row.meta)))
    return samples


def generate_samples(env_cls: Any, n: int, *, seed: int = 0, split: str = "train",
                     data: DataParams | None = None) -> list[Sample]:
    """`n` samples of split `split` from the env's embedded generator (data: a DataParams; None: the defaults)."""
    if n < 1:
        raise ValueError(f"{env_cls.name}.generate: n must be >= 1, got {n}")
    splits = (*layout.SPLITS, *layout.OPTIONAL_SPLITS)
    if split not in splits:
        raise ValueError(f"{env_cls.name}.generate: split must be one of {splits}, got {split!r}")
    if env_cls.schema is None:
        raise ValueError(f"env {env_cls.name!r} declares no row schema, so its raw rows cannot become samples")
    # The other split gets one sample: a generator may make one split depend on the other (test places kept
    # away from train ones).
    data = replace(data or DataParams(), source="synthetic", seed=seed,
                   train_images=n if split == "train" else 1, test_images=n if split == "test" else 1,
                   ood_images=n if split == "test_ood" else 0)
    with tempfile.TemporaryDirectory(prefix=f"vlmgym-{env_cls.name}-") as tmp:
        env_cls.write_synthetic(data, Path(tmp))
        if not layout.csv_path(Path(tmp), split).exists():
            raise ValueError(f"env {env_cls.name!r}: its generator defines no {split} split")
        samples = read_raw_split(Path(tmp), split, env_cls.schema)
    if not samples:
        raise ShardError(f"env {env_cls.name!r}: its generator wrote no valid {split} row")
    return samples
