"""The raw layout shared by the download and shard stages.

Raw layout (the Hugging Face hub layout of OSV-5M): `{raw}/{split}.csv` and
`{raw}/images/{split}/NN.zip` holding `{id}.jpg`. Zips are read in place, never
extracted, and member names come from outside, so unsafe ones are rejected.
"""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from vlmgym.runtime.atomic import atomic_file

SPLITS = ("train", "test")  # every raw layout has these
# Written only by a generator that defines a distribution shift (Env docs: the out-of-distribution test split);
# the shard, rollout and evaluate stages carry it through when it is there.
OPTIONAL_SPLITS = ("test_ood",)

OSV5M_COLUMNS = (
    "id", "latitude", "longitude", "thumb_original_url", "country", "sequence", "captured_at", "lon_bin",
    "lat_bin", "cell", "region", "sub-region", "city", "land_cover", "road_index", "drive_side", "climate", "soil",
    "dist_sea", "quadtree_10_5000", "quadtree_10_25000", "quadtree_10_1000", "quadtree_10_50000",
    "quadtree_10_12500", "quadtree_10_500", "quadtree_10_2500", "unique_region", "unique_sub-region", "unique_city",
    "unique_country", "creator_username", "creator_id",
)

# Zip timestamps are fixed so that identical content gives identical bytes (stable DVC hashes).
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
MAX_MEMBER_BYTES = 64 * 1024 * 1024  # OSV-5M images are 20-65 kB


class RawLayoutError(ValueError):
    """The raw layout is broken in a way that cannot be skipped row by row."""

    user_error = True  # the stages print its message as one line (vlmgym.runtime.errors)


def csv_path(raw_dir: Path, split: str) -> Path:
    """Path of a split's CSV in the raw layout."""
    return Path(raw_dir) / f"{split}.csv"


def present_splits(raw_dir: Path) -> list[str]:
    """The required splits, then each optional split whose CSV the raw layout holds."""
    return [*SPLITS, *(s for s in OPTIONAL_SPLITS if csv_path(raw_dir, s).exists())]


def zip_dir(raw_dir: Path, split: str) -> Path:
    """Folder holding a split's image zips."""
    return Path(raw_dir) / "images" / split


def zip_name(index: int) -> str:
    """Hub name of the index-th zip of a split (00.zip, 01.zip, ...)."""
    return f"{index:02d}.zip"


def is_safe_member(name: str) -> bool:
    """Whether a zip member name is a plain relative path (no absolute path, drive or `..`)."""
    if not name or name.startswith(("/", "\\")) or "\\" in name or (len(name) > 1 and name[1] == ":"):
        return False
    return ".." not in PurePosixPath(name).parts


@dataclass
class ZipIndex:
    """Where each image file name lives among a split's zips, read from their central directories."""

    members: dict[str, tuple[Path, str]] = field(default_factory=dict)  # basename -> (zip path, member name)
    unsafe_members: int = 0
    oversized_members: int = 0
    duplicate_members: int = 0

    @classmethod
    def build(cls, zips: list[Path]) -> ZipIndex:
        """Index the `.jpg` members of `zips` by base name; a zip that cannot be opened is an error."""
        index = cls()
        for path in zips:
            try:
                with zipfile.ZipFile(path) as archive:
                    infos = archive.infolist()
            except (zipfile.BadZipFile, OSError) as err:
                raise RawLayoutError(f"{path}: not a readable zip ({err}); delete it and download again") from err
            for info in infos:
                if info.is_dir():
                    continue
                if not is_safe_member(info.filename):
                    index.unsafe_members += 1
                    continue
                if info.file_size > MAX_MEMBER_BYTES:  # a zip bomb would otherwise be read into memory
                    index.oversized_members += 1
                    continue
                # Real hub zips may hold a top folder; the image is found by its base name either way.
                base = PurePosixPath(info.filename).name
                if base in index.members:
                    index.duplicate_members += 1
                    continue
                index.members[base] = (path, info.filename)
        return index

    def __contains__(self, name: str) -> bool:
        return name in self.members


class ZipReader:
    """Reads members from several zips, keeping each zip open once."""

    def __init__(self) -> None:
        self._open: dict[Path, zipfile.ZipFile] = {}

    def read(self, path: Path, member: str) -> bytes:
        """Bytes of one member (zipfile checks its CRC)."""
        if path not in self._open:
            self._open[path] = zipfile.ZipFile(path)
        return self._open[path].read(member)

    def close(self) -> None:
        """Close every open zip."""
        for archive in self._open.values():
            archive.close()
        self._open.clear()

    def __enter__(self) -> ZipReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split_zips(raw_dir: Path, split: str) -> list[Path]:
    """The split's zips, sorted by name."""
    folder = zip_dir(raw_dir, split)
    return sorted(folder.glob("*.zip")) if folder.is_dir() else []


def iter_csv(path: Path) -> Iterator[tuple[int, list[str], list[str]]]:
    """(line number, header, fields) per data row; every value stays a string (Namibia's NA stays NA)."""
    with Path(path).open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
            for fields in reader:
                if fields:
                    yield reader.line_num, header, fields
        except StopIteration as err:
            raise RawLayoutError(f"{path}: empty CSV, expected a header row") from err
        except (csv.Error, UnicodeDecodeError) as err:
            # Text is decoded in blocks: for a decoding error the byte position in `err` is exact, the line is not.
            raise RawLayoutError(f"{path}: unreadable CSV near line {reader.line_num + 1} ({err})") from err


def read_header(path: Path) -> list[str]:
    """The header row of a CSV."""
    try:
        with Path(path).open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), None)
    except (csv.Error, UnicodeDecodeError) as err:
        raise RawLayoutError(f"{path}: unreadable CSV near line 1 ({err})") from err
    if not header:
        raise RawLayoutError(f"{path}: empty CSV, expected a header row")
    return header


def write_csv(path: Path, header: list[str] | tuple[str, ...], rows: list[list[str]]) -> None:
    """Write a CSV atomically with fixed line endings."""
    with atomic_file(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def encode_jpeg(image, quality: int = 92) -> bytes:
    """RGB JPEG bytes of a PIL image, as the synthetic generators store their images."""
    import io

    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def write_zip(path: Path, members: list[tuple[str, bytes]]) -> None:
    """Write a zip of stored (uncompressed: JPEGs do not shrink) members with fixed timestamps, atomically."""
    with atomic_file(path) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=ZIP_DATE_TIME)
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)


def write_split(out_dir: Path, split: str, columns: Sequence[str],
                items: Iterable[tuple[list[str], list[tuple[str, bytes]]]], images_per_zip: int = 10_000) -> int:
    """{split}.csv and images/{split}/NN.zip from (CSV row, [(image name, bytes), ...]) items, as the synthetic
    generators write them: zips written as they fill (`images_per_zip` images each; one empty zip when there are no
    rows), zips of an earlier, larger run removed, and the CSV last, so a split whose CSV exists has its images.
    Returns the rows written."""
    out_dir = Path(out_dir)
    rows: list[list[str]] = []
    members: list[tuple[str, bytes]] = []
    zips: list[Path] = []

    def flush() -> None:
        zips.append(zip_dir(out_dir, split) / zip_name(len(zips)))
        write_zip(zips[-1], members)
        members.clear()

    for row, images in items:
        rows.append(row)
        members.extend(images)
        if len(members) >= images_per_zip:
            flush()
    if members or not zips:
        flush()
    for stale in set(split_zips(out_dir, split)) - set(zips):
        stale.unlink()
    write_csv(csv_path(out_dir, split), columns, rows)
    return len(rows)


def tree_bytes(path: Path) -> int:
    """Total size of the files under a folder."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
