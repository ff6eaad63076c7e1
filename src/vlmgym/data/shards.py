"""Reading the webdataset shards back: the reader the environments and later stages use."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import webdataset as wds
from PIL import Image

IMAGE_TYPES = ("jpg", "jpeg", "png")


@dataclass
class Sample:
    """One decoded sample: its key, its images (RGB) and its json metadata."""

    key: str
    images: list[Image.Image] = field(default_factory=list)
    meta: dict = field(default_factory=dict)


def split_shards(shards_dir: str | Path, split: str) -> list[Path]:
    """The tars of a split, in order; a missing split folder is an error."""
    folder = Path(shards_dir) / split
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no shards for split {split!r}; run the shard stage first")
    return sorted(folder.glob("shard-*.tar"))


def read_split(shards_dir: str | Path, split: str, limit: int | None = None,
               image_exts: tuple[str, ...] | None = None) -> list[Sample]:
    """Decode the first `limit` samples (all when None) of a split with webdataset.WebDataset.

    A sample's images come in the order of `image_exts` (an env schema's, e.g. ("left.jpg", "right.jpg")),
    then any others by name; without it, by name."""
    order = tuple(image_exts or ())

    def rank(ext: str) -> tuple[int, str]:
        return (order.index(ext), ext) if ext in order else (len(order), ext)

    urls = [str(p) for p in split_shards(shards_dir, split)]
    if not urls or limit == 0:
        return []
    dataset = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil")
    samples = []
    for raw in dataset:
        exts = sorted((k for k in raw if k.rsplit(".", 1)[-1] in IMAGE_TYPES), key=rank)
        if "json" not in raw:
            raise ValueError(f"{raw.get('__url__')}: sample {raw['__key__']!r} has no .json")
        samples.append(Sample(key=raw["__key__"], images=[raw[k].convert("RGB") for k in exts], meta=raw["json"]))
        if limit is not None and len(samples) >= limit:
            break
    return samples
