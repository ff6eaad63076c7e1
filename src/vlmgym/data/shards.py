"""Reading the webdataset shards back: the reader the environments and later stages use.

`open_split` indexes a split's tars (their headers and the small json members) and decodes a sample's images only
when they are asked for, so an env over millions of samples holds their metadata, never their pixels; `read_split`
decodes everything up front (webdataset), for small splits and as the reference the lazy reader is tested against.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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
    import webdataset as wds  # here, not at the top: it imports torch (seconds), which open_split's users never need

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


def decode_image(data: bytes) -> Image.Image:
    """RGB image from encoded bytes, decoded as webdataset's "pil" decoder does (same pixels)."""
    with io.BytesIO(data) as stream:
        image = Image.open(stream)
        image.load()
    return image.convert("RGB")


class StoredImages(Sequence):
    """A sample's images as a sequence that reads and decodes each one from its tar when indexed (never kept)."""

    __slots__ = ("_members", "_tars")

    def __init__(self, tars: Sequence[Path], members: tuple[tuple[int, int, int], ...]):
        self._tars, self._members = tars, members  # (tar number, data offset, size) per image

    def __len__(self) -> int:
        return len(self._members)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        tar, offset, size = self._members[index]
        with open(self._tars[tar], "rb") as handle:
            handle.seek(offset)
            data = handle.read(size)
        if len(data) != size:
            raise OSError(f"{self._tars[tar]}: truncated at byte {offset + len(data)}; run the shard stage again")
        return decode_image(data)


class StoredSample:
    """One sample of a split opened with `open_split`: key, images (decoded on access) and meta (parsed on access,
    so the index holds the json's bytes only)."""

    __slots__ = ("_meta", "images", "key")

    def __init__(self, key: str, images: StoredImages, meta: bytes):
        self.key, self.images, self._meta = key, images, meta

    @property
    def meta(self) -> dict:
        return json.loads(self._meta)


class StoredSplit(Sequence):
    """A split's samples in shard order (`read_split`'s order), indexed once; sample i is built on access."""

    def __init__(self, tars: list[Path], keys: list[str], members: list[tuple[tuple[int, int, int], ...]],
                 metas: list[bytes]):
        self.tars, self._keys, self._members, self._metas = tars, keys, members, metas

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]  # negative indices, and IndexError past the end
        return StoredSample(self._keys[index], StoredImages(self.tars, self._members[index]), self._metas[index])

    def __iter__(self) -> Iterator[StoredSample]:
        return (self[i] for i in range(len(self)))


def open_split(shards_dir: str | Path, split: str, limit: int | None = None,
               image_exts: tuple[str, ...] | None = None) -> StoredSplit:
    """The first `limit` samples (all when None) of a split, with `read_split`'s keys, order, image order and meta,
    reading only the tars' headers and json members now; images are decoded when a sample's are indexed."""
    order = tuple(image_exts or ())

    def rank(ext: str) -> tuple[int, str]:
        return (order.index(ext), ext) if ext in order else (len(order), ext)

    tars = split_shards(shards_dir, split)
    keys: list[str] = []
    members: list[tuple[tuple[int, int, int], ...]] = []
    metas: list[bytes] = []

    def finish(key: str | None, files: dict[str, tuple[int, int, int]], meta: bytes | None, where: Path) -> None:
        if key is None:
            return
        if meta is None:
            raise ValueError(f"{where}: sample {key!r} has no .json")
        exts = sorted((e for e in files if e.rsplit(".", 1)[-1] in IMAGE_TYPES), key=rank)
        keys.append(key)
        members.append(tuple(files[e] for e in exts))
        metas.append(meta)

    for number, path in enumerate(tars):
        if limit is not None and len(keys) >= limit:
            break
        key, files, meta = None, {}, None
        with tarfile.open(path) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                # webdataset's grouping (tariterators.base_plus_ext): the key ends at the base name's first dot.
                _, dot, ext = member.name.rpartition("/")[2].partition(".")
                if not dot:
                    continue
                stem = member.name[: len(member.name) - len(ext) - 1]
                if stem != key:
                    finish(key, files, meta, path)
                    if limit is not None and len(keys) >= limit:
                        key = None
                        break
                    key, files, meta = stem, {}, None
                ext = ext.lower()
                if ext in files or (ext == "json" and meta is not None):
                    raise ValueError(f"{path}: duplicate file name {member.name!r} in sample {key!r}")
                if ext == "json":
                    meta = tar.extractfile(member).read()
                else:
                    files[ext] = (number, member.offset_data, member.size)
        finish(key, files, meta, path)
    if limit is not None:
        del keys[limit:], members[limit:], metas[limit:]
    return StoredSplit(tars, keys, members, metas)
