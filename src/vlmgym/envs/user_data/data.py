"""user_data's data: the user's files (read.py) into the raw layout, split into train and test; or, with no file
given, a small embedded demo set.

The raw layout: `{split}.csv` with columns id, question, answer, images (the sample's image names joined by `|`),
columns (the row's other columns as JSON), and `images/{split}/NN.zip` holding the JPEGs.

Splits (the val split is held out of train by the shard stage, `shard.val_samples`, as for every env):
- `train` and `test` given: each file (or folder) is that split; a folder with several splits gives the one of
  that name (for test: `test`, else `validation`);
- `path` alone: its own splits where it has them (a DatasetDict, or parquet files named train*/test*/
  validation*): `train`, and `test` (else `validation`); a jsonl, one Dataset or unnamed parquet files are one
  set, split by a seed: the `test_share` of its rows whose sha256 of "<data.seed>:<key>" is lowest (at least one
  row, at most half) is test, the rest train, so the split depends on neither the file's order nor its other rows;
- a `validation` split beside `train` and `test` is not read (vlmgym's val comes from train).
`data.train_images` / `data.test_images` do not cap the user's data (shard.max_train / max_test do).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from vlmgym.config.spec import spec
from vlmgym.data import layout
from vlmgym.envs.user_data.read import (
    Columns,
    Record,
    Skips,
    UserDataError,
    dataset_splits,
    read_jsonl,
    read_rows,
)

log = logging.getLogger(__name__)
CSV_COLUMNS = ("id", "question", "answer", "images", "columns")
SEPARATOR = "|"


@dataclass(frozen=True)
class UserDataFiles:
    """user_data's data: your files (a VLM-R1 jsonl, a `datasets` folder or parquet files), read as they are."""

    path: str = spec("", doc="your data: a .jsonl (VLM-R1's conversations), a `datasets` save_to_disk folder, a "
                             ".parquet file or a folder of them; train and test from its splits, or a seeded "
                             "split (test_share) of one set ('': train and test below, or the embedded demo)")
    train: str = spec("", doc="the train split's file or folder, instead of path (with test)")
    test: str = spec("", doc="the test split's file or folder, instead of path (with train)")
    image_root: str = spec("", doc="folder a jsonl's image paths are relative to ('': the jsonl's folder)")
    image_column: str = spec("image", doc="a table's column of the image, or a list of images")
    question_column: str = spec("question", doc="a table's column of the question")
    answer_column: str = spec("answer", doc="a table's column of the answer (text, a number, or a box of 4)")
    test_share: float = spec(0.1, gt=0, le=0.5, doc="share of one set's rows split off as test (by a seeded hash)")

    def given(self) -> bool:
        """Whether files are given (else the demo set)."""
        return bool(self.path or self.train or self.test)

    def columns(self) -> Columns:
        return Columns(self.image_column, self.question_column, self.answer_column)


def _read(path_text: str, files: UserDataFiles) -> dict[str, tuple[str, Any, Skips]]:
    """{split name: (where, records, its skips)} of one file or folder ("all": one set)."""
    path = Path(path_text)
    root = Path(files.image_root) if files.image_root else None
    if path.suffix == ".jsonl":
        skips = Skips()
        return {"all": (path.name, read_jsonl(path, root, skips), skips)}
    out = {}
    for split, (where, rows) in dataset_splits(path, files.columns()).items():
        skips = Skips()
        out[split] = (where, read_rows(rows, where, files.columns(), root or path, skips), skips)
    return out


def _pick(parts: dict[str, tuple[str, Any, Skips]], wanted: tuple[str, ...], where: str) -> tuple[str, Any, Skips]:
    for name in wanted:
        if name in parts:
            return parts[name]
    if "all" in parts and len(parts) == 1:
        return parts["all"]
    raise UserDataError(f"{where}: no split {' or '.join(wanted)} (it has {sorted(parts)})")


def hash_split(records: list[Record], share: float, seed: int, where: str) -> tuple[list[Record], list[Record]]:
    """(train, test) of one set: the `share` of rows whose sha256 of "<seed>:<key>" is lowest is test."""
    if len(records) < 2:
        raise UserDataError(f"{where}: {len(records)} usable row(s), too few to split into train and test; give "
                           "more rows, or data.user_data.train and test")
    count = min(len(records) // 2, max(1, round(share * len(records))))
    ranked = sorted(records, key=lambda r: hashlib.sha256(f"{seed}:{r.key}".encode()).hexdigest())
    test = {r.key for r in ranked[:count]}
    return [r for r in records if r.key not in test], [r for r in records if r.key in test]


def _usable(part: tuple[str, Any, Skips], where: str) -> tuple[list[Record], dict[str, Any]]:
    """(the records of a part, its details); an UserDataError when none is usable."""
    name, records, skips = part
    records = list(records)
    where = f"{where} ({name})" if name != Path(where).name else where
    if not records:
        first = next(iter(skips.examples.values()), ["no rows"])[0]
        raise UserDataError(f"{where}: no usable row (skipped: {dict(sorted(skips.counts.items()))}; e.g. {first})")
    return records, {"from": where, "rows": len(records), **skips.as_dict()}


def user_records(files: UserDataFiles, seed: int) -> tuple[dict[str, list[Record]], dict[str, Any]]:
    """({"train": records, "test": records}, details: where each came from and what was skipped)."""
    if files.path and (files.train or files.test):
        raise UserDataError("data.user_data: give either path, or train and test, not both")
    splits: dict[str, list[Record]] = {}
    details: dict[str, Any] = {}
    wanted = {"train": ("train",), "test": ("test", "validation", "val")}
    if not files.path:
        if not (files.train and files.test):
            raise UserDataError("data.user_data: give both train and test (or path alone for a seeded split)")
        for split, text in (("train", files.train), ("test", files.test)):
            splits[split], details[split] = _usable(_pick(_read(text, files), wanted[split], text), text)
        return splits, details
    parts = _read(files.path, files)
    if "train" in parts and any(name in parts for name in wanted["test"]):
        for split in ("train", "test"):
            splits[split], details[split] = _usable(_pick(parts, wanted[split], files.path), files.path)
        return splits, details
    if len(parts) != 1:
        raise UserDataError(f"{files.path}: splits {sorted(parts)}; expected train and test (or validation), or "
                           "one set to split")
    everything, details["all"] = _usable(next(iter(parts.values())), files.path)
    splits["train"], splits["test"] = hash_split(everything, files.test_share, seed, files.path)
    details["all"]["split"] = (f"seeded: test is the {files.test_share:g} share of rows with the lowest "
                               f"sha256('{seed}:<id>')")
    return splits, details


def write_split(out_dir: Path, split: str, records: list[Record]) -> int:
    """The raw layout of one split."""
    def items():
        for record in records:
            names = [f"{record.key}-{i}.jpg" for i in range(len(record.images))]
            row = [record.key, record.question, record.answer, SEPARATOR.join(names),
                   json.dumps(record.columns, ensure_ascii=False, sort_keys=True)]
            yield row, list(zip(names, record.images))

    return layout.write_split(out_dir, split, CSV_COLUMNS, items())


def write_user_raw(files: UserDataFiles, seed: int, out_dir: Path) -> dict[str, Any]:
    """The user's files as the raw layout; returns where each split came from, row counts and skips."""
    splits, details = user_records(files, seed)
    for split, records in splits.items():
        write_split(out_dir, split, records)
        details[f"{split}_rows"] = len(records)
    for part in details.values():
        if isinstance(part, dict) and part.get("skipped"):
            log.warning("%s: skipped %s, e.g. %s", part["from"], part["skipped"],
                        next(iter(part["examples"].values()))[0])
    return details


# --- the embedded demo set (no file given) ---------------------------------------------------

DEMO_COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 60, 220), "yellow": (230, 210, 40)}
DEMO_QUESTIONS = {
    "text": "<image>What colour is the square? Answer with one word.",
    "number": "<image>How many squares are there? Answer with a number.",
    "choice": "<image>What colour is the square? A. red B. green C. blue D. yellow. Answer with the letter.",
    "box": "<image>Where is the square? Answer [x1, y1, x2, y2], 0-1000 relative to the image.",
}


def demo_record(seed: int, split: str, index: int, width: int, height: int) -> Record:
    """One demo sample: squares of one colour on grey, and a question of one of the four answer kinds."""
    rng = np.random.default_rng([seed, ("train", "test", "test_ood").index(split), index])
    kind = ("text", "number", "choice", "box")[index % 4]
    colour = sorted(DEMO_COLOURS)[int(rng.integers(len(DEMO_COLOURS)))]
    count = int(rng.integers(1, 4)) if kind == "number" else 1
    side = max(8, min(width, height) // 4)
    image = Image.new("RGB", (width, height), (128, 128, 128))
    draw = ImageDraw.Draw(image)
    box = None
    for i in range(count):
        x = int(rng.integers(0, width - side)) if count == 1 else i * width // count + 2
        y = int(rng.integers(0, height - side))
        draw.rectangle((x, y, x + side - 1, y + side - 1), fill=DEMO_COLOURS[colour])
        box = (x, y, x + side, y + side)
    answers = {"text": colour, "number": str(count), "choice": "ABCD"[list(DEMO_COLOURS).index(colour)],
               "box": "[{}, {}, {}, {}]".format(*(round(1000 * v / s) for v, s in zip(box, (width, height) * 2)))}
    question = DEMO_QUESTIONS[kind].replace("<image>", "")
    key = f"{split}{index:05d}"
    return Record(key, (layout.encode_jpeg(image),), question, answers[kind],
                  {"kind": kind, "solution": answers[kind], "problem": question})


def write_demo_raw(data: Any, out_dir: Path) -> dict[str, Any]:
    """The demo set in the raw layout: data.train_images / test_images samples, cycling through the kinds."""
    counts = {}
    for split, n in (("train", data.train_images), ("test", data.test_images)):
        records = [demo_record(data.seed, split, i, data.image_width, data.image_height) for i in range(n)]
        counts[f"{split}_rows"] = write_split(out_dir, split, records)
    return {"demo": True, **counts}
