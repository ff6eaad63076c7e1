"""Reading the webdataset shards back: the reader the environments and later stages use.

`open_split` indexes a split's tars (their headers and the small json members) and decodes a sample's images only
when they are asked for, so an env over millions of samples holds their metadata, never their pixels; `read_split`
decodes everything up front (webdataset), for small splits and as the reference the lazy reader is tested against.

`open_split` reads every byte of a tar once as it indexes it and checks the bytes' sha256 against the one the shard
stage recorded in the manifest (shards_dir/manifest.json), so a tar changed after the shard stage wrote it (even at
the same size and modification time, which DVC trusts) stops the stage that reads it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

IMAGE_TYPES = ("jpg", "jpeg", "png")
MANIFEST = "manifest.json"
# Bytes read at a time where tarfile would seek over member data: small, because an index of many small samples is
# meant to cost about a kilobyte each (tests/data/test_open_split.py), and larger reads were no faster.
SKIP_BUFFER = 1 << 14
# How to get shards that match their manifest again: DVC's copy (--relink copies it whatever the modification time
# says; --force lets it replace a file DVC sees as changed), or the shard stage's own output afresh.
RECOVER = ("restore the shards with `dvc checkout --relink --force data/shards` or write them again with "
           "`dvc repro -f -s shard`")

log = logging.getLogger(__name__)


class ShardIntegrityError(ValueError):
    """A split's tars are not the ones its manifest describes (changed bytes, a tar added or missing)."""

    user_error = True  # the stages print its message as one line (vlmgym.runtime.errors)


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


def recorded_checksums(shards_dir: str | Path, split: str) -> dict[str, str] | None:
    """{tar name: sha256} of a split as the shard stage recorded them in shards_dir/manifest.json; None where it
    recorded none (no manifest, or one written before the manifest held checksums)."""
    path = Path(shards_dir) / MANIFEST
    if not path.is_file():
        return None
    shards = json.loads(path.read_text()).get("splits", {}).get(split, {}).get("shards")
    if shards is None:
        raise ShardIntegrityError(f"{path} lists no split {split!r}, which {Path(shards_dir) / split} holds: the "
                                  f"shards and their manifest come from different runs; {RECOVER}")
    if not all("sha256" in shard for shard in shards):
        return None
    return {shard["name"]: shard["sha256"] for shard in shards}


def split_checksums(shards_dir: str | Path, split: str, tars: list[Path]) -> dict[str, str] | None:
    """The recorded checksums of `tars`, a split's tars on disk (see recorded_checksums); a tar on disk the manifest
    does not list, or one it lists that is gone, is an error; a split without checksums is read with a warning."""
    recorded = recorded_checksums(shards_dir, split)
    if recorded is None:
        log.warning("%s: no sha256 per tar in %s, so its tars are read unchecked; write the shards again with "
                    "`dvc repro -f -s shard` to have them checked", Path(shards_dir) / split,
                    Path(shards_dir) / MANIFEST)
        return None
    _same_tars(shards_dir, split, tars, recorded)
    return recorded


def _same_tars(shards_dir: str | Path, split: str, tars: list[Path], recorded: dict[str, str]) -> None:
    names = {tar.name for tar in tars}
    for name in sorted(names ^ set(recorded)):
        state = "is not in" if name in names else "is listed in"
        raise ShardIntegrityError(f"{Path(shards_dir) / split / name} {state} {Path(shards_dir) / MANIFEST}"
                                  f"{'' if name in names else ' but missing'}: the shards and their manifest come "
                                  f"from different runs; {RECOVER}")


def split_identity(shards_dir: str | Path, split: str) -> str | None:
    """A hash of the content of a split's tars: from the manifest's checksums where it has them (which `open_split`
    holds the tars to), else from every byte of the tars; None when the split is not there."""
    folder = Path(shards_dir) / split
    if not folder.is_dir():
        return None
    tars = split_shards(shards_dir, split)
    recorded = recorded_checksums(shards_dir, split)
    if recorded is not None:
        _same_tars(shards_dir, split, tars, recorded)
    digest = hashlib.sha256()
    for tar in tars:
        digest.update(tar.name.encode())
        if recorded is not None:
            digest.update(recorded[tar.name].encode())
            continue
        with tar.open("rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()[:16]


class _HashingReader:
    """A file read front to back whose every byte passes through sha256 once: tarfile's forward seeks over member
    data are reads here, so indexing a tar also checks it, without a second pass over the file."""

    def __init__(self, handle: io.BufferedReader):
        self._handle, self._position, self.digest = handle, 0, hashlib.sha256()
        self._buffer = memoryview(bytearray(SKIP_BUFFER))

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self.digest.update(data)
        self._position += len(data)
        return data

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence != io.SEEK_SET or offset < self._position:
            raise io.UnsupportedOperation(f"the shard reader reads tars front to back; asked to seek back to {offset}")
        while self._position < offset:
            got = self._handle.readinto(self._buffer[: min(len(self._buffer), offset - self._position)])
            if not got:
                break  # past the end: the next read says so, as a real file's would
            self.digest.update(self._buffer[:got])
            self._position += got
        return self._position

    def hexdigest_to_end(self) -> str:
        """The sha256 of the whole file, reading what tarfile left (the end-of-archive blocks, or the rest of a
        tar `open_split`'s limit stopped in)."""
        while got := self._handle.readinto(self._buffer):
            self.digest.update(self._buffer[:got])
        return self.digest.hexdigest()


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


def _check(path: Path, actual: str, recorded: str, cause: Exception | None = None) -> None:
    if actual != recorded:
        raise ShardIntegrityError(f"{path}: sha256 {actual[:12]}... is not the {recorded[:12]}... the shard stage "
                                  f"recorded in {path.parent.parent / MANIFEST} (the tar changed after it was "
                                  f"written); {RECOVER}") from cause


def open_split(shards_dir: str | Path, split: str, limit: int | None = None,
               image_exts: tuple[str, ...] | None = None, verify: bool = True) -> StoredSplit:
    """The first `limit` samples (all when None) of a split, with `read_split`'s keys, order, image order and meta,
    keeping only the tars' headers and json members now; images are decoded when a sample's are indexed. Each tar
    opened is read whole once and checked against the manifest's sha256 (ShardIntegrityError on a mismatch);
    `verify` False seeks over the images unchecked instead (`vlmgym bench data` measures what checking costs)."""
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

    def index_tar(tar: tarfile.TarFile, path: Path, number: int) -> None:
        key, files, meta = None, {}, None
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
                    return
                key, files, meta = stem, {}, None
            ext = ext.lower()
            if ext in files or (ext == "json" and meta is not None):
                raise ValueError(f"{path}: duplicate file name {member.name!r} in sample {key!r}")
            if ext == "json":
                meta = tar.extractfile(member).read()
            else:
                files[ext] = (number, member.offset_data, member.size)
        finish(key, files, meta, path)

    checksums = split_checksums(shards_dir, split, tars) if verify else None
    for number, path in enumerate(tars):
        if limit is not None and len(keys) >= limit:
            break
        if checksums is None:  # nothing to check against: seek over the images, as tarfile does
            with tarfile.open(path) as tar:
                index_tar(tar, path, number)
            continue
        with path.open("rb") as handle:
            reader = _HashingReader(handle)
            try:
                with tarfile.open(fileobj=reader, mode="r:") as tar:
                    index_tar(tar, path, number)
            except (tarfile.TarError, ValueError) as err:  # a changed header breaks the tar: say why, if so
                _check(path, reader.hexdigest_to_end(), checksums[path.name], err)
                raise
            _check(path, reader.hexdigest_to_end(), checksums[path.name])
    if limit is not None:
        del keys[limit:], members[limit:], metas[limit:]
    return StoredSplit(tars, keys, members, metas)
