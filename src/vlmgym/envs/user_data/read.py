"""Reading the user's files into records: VLM-R1's jsonl, and a Hugging Face `datasets` folder or parquet files.

A record is one sample: its key, its images (JPEG bytes, 1 to MAX_IMAGES), the question (the `<image>`
placeholders taken out), the answer, and the row's other columns (what a TRL-style reward function gets).

VLM-R1's jsonl: one JSON object a line, `{"id": ..., "image": "a.jpg" or ["a.jpg", "b.jpg"], "conversations":
[{"from": "human", "value": "<image>question"}, {"from": "gpt", "value": "answer"}]}`; image paths relative to
the image root (default: the jsonl's folder), or absolute. The first human turn is the question, the gpt turn
after it the answer; later turns are not read. Where the question holds `<image>` placeholders, there must be one
per image.

A `datasets` folder (`save_to_disk` of a Dataset or a DatasetDict) or parquet files (one file, or a folder of
them): an image column (an Image feature, bytes, a path, or a list of them), a question column and an answer
column (names configurable). The answer may be text, a number, or four numbers (a box, written `[x1, y1, x2, y2]`).
Read with `datasets.load_from_disk` and pyarrow: local files only, no loading script, no pickle.

A bad row is skipped and counted by reason, with its file and line (or row) named in the examples: `bad_json`,
`bad_types`, `missing_question`, `missing_answer`, `image_missing` (no image, or a file that is not there),
`image_unreadable` (not an image PIL can decode), `image_count` (more than MAX_IMAGES, or not one per `<image>`).
An id seen before (several questions about one image often share it) gets its line or row number added to its key.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from vlmgym.data import layout
from vlmgym.data.rows import RowSkip

MAX_IMAGES = 4
MAX_EXAMPLES = 5
PLACEHOLDER = "<image>"
MAX_COLUMN_CHARS = 10_000  # a column's JSON longer than this is not passed to reward functions


class UserDataError(ValueError):
    """The user's data cannot be read at all (no file, no usable row, a missing column)."""

    user_error = True  # the stages print its message as one line (vlmgym.runtime.errors)


@dataclass(frozen=True)
class Record:
    key: str
    images: tuple[bytes, ...]
    question: str
    answer: str
    columns: dict[str, Any]


@dataclass
class Skips:
    """Skipped rows by reason, with up to MAX_EXAMPLES places ("data.jsonl line 7: ...") per reason."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, where: str) -> None:
        self.counts[reason] += 1
        if len(self.examples.setdefault(reason, [])) < MAX_EXAMPLES:
            self.examples[reason].append(where)

    def as_dict(self) -> dict[str, Any]:
        return {"skipped": dict(sorted(self.counts.items())), "examples": dict(sorted(self.examples.items()))}


def safe_key(value: Any, fallback: str) -> str:
    """A sample key (letters, digits, _ and -; webdataset splits names at dots) from an id, else `fallback`."""
    text = re.sub(r"[^A-Za-z0-9_-]", "_", str(value).strip())[:100] if value is not None else ""
    return text.strip("_") or fallback


def _decode(data: bytes, what: str) -> bytes:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return layout.encode_jpeg(image)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise RowSkip("image_unreadable", f"{what}: {type(err).__name__}: {err}") from None


def _read_file(path: Path) -> bytes:
    if not path.is_file():
        raise RowSkip("image_missing", f"{path}: no such file")
    return _decode(path.read_bytes(), str(path))


def image_bytes(value: Any, root: Path) -> bytes:
    """JPEG bytes of one image value: a path (relative to `root`), bytes, a {"bytes", "path"} dict, a PIL image."""
    if isinstance(value, Image.Image):
        return layout.encode_jpeg(value)
    if isinstance(value, bytes | bytearray):
        return _decode(bytes(value), "image bytes")
    if isinstance(value, Mapping):
        if value.get("bytes"):
            return _decode(bytes(value["bytes"]), "image bytes")
        value = value.get("path")
    if isinstance(value, str) and value.strip():
        return _read_file(root / value.strip())
    raise RowSkip("image_missing" if value is None or value == "" else "bad_types",
               f"image {str(value)[:80]!r} is neither a path nor image bytes")


def images_of(value: Any, root: Path) -> tuple[bytes, ...]:
    """The images of a row's image value (one, or a list of them)."""
    values = list(value) if isinstance(value, list | tuple) else [value]
    if not values or values == [None]:
        raise RowSkip("image_missing", "no image")
    if len(values) > MAX_IMAGES:
        raise RowSkip("image_count", f"{len(values)} images, at most {MAX_IMAGES}")
    return tuple(image_bytes(v, root) for v in values)


def question_of(text: Any, images: int) -> str:
    """The question with its `<image>` placeholders taken out (one per image when there are any)."""
    if not isinstance(text, str):
        raise RowSkip("missing_question" if text is None else "bad_types", f"question {text!r} is not text")
    placeholders = text.count(PLACEHOLDER)
    if placeholders and placeholders != images:
        raise RowSkip("image_count", f"{placeholders} {PLACEHOLDER} placeholders for {images} images")
    question = " ".join(text.replace(PLACEHOLDER, " ").split())
    if not question:
        raise RowSkip("missing_question", "empty question")
    return question


def answer_of(value: Any) -> str:
    """The answer as text: text, a number, or four numbers (a box)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise RowSkip("missing_answer", "no answer")
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool):
        raise RowSkip("bad_types", f"answer {value!r} is a bool, expected text, a number or a box")
    if isinstance(value, int | float) and math.isfinite(value):
        return str(value)
    if (isinstance(value, list | tuple) and len(value) == 4
            and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    raise RowSkip("bad_types", f"answer {str(value)[:80]!r} is not text, a finite number or a box of 4 numbers")


def columns_of(row: Mapping[str, Any], leave: set[str]) -> dict[str, Any]:
    """The row's other columns that are JSON values of a sane size (a reward function's keyword arguments)."""
    out = {}
    for name, value in row.items():
        if name in leave or not isinstance(name, str) or not name.isidentifier():
            continue
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            continue
        if len(text) <= MAX_COLUMN_CHARS:
            out[name] = value
    return out


def _record(key: str, images: tuple[bytes, ...], question: str, answer: str, columns: dict[str, Any]) -> Record:
    columns.setdefault("solution", answer)  # VLM-R1's and TRL's examples' names
    columns.setdefault("problem", question)
    return Record(key, images, question, answer, columns)


def _conversation(row: Mapping[str, Any]) -> tuple[Any, Any]:
    turns = row.get("conversations")
    if not isinstance(turns, list) or not all(isinstance(t, Mapping) for t in turns):
        raise RowSkip("bad_types", "conversations is not a list of {from, value} turns")
    for i, turn in enumerate(turns):
        if turn.get("from") in ("human", "user"):
            after = [t for t in turns[i + 1:] if t.get("from") in ("gpt", "assistant")]
            return turn.get("value"), after[0].get("value") if after else None
    raise RowSkip("missing_question", "no human turn")


def read_jsonl(path: Path, image_root: Path | None, skips: Skips) -> Iterator[Record]:
    """The usable records of a VLM-R1 jsonl; bad lines are counted in `skips`."""
    if not path.is_file():
        raise UserDataError(f"{path}: no such file (data.user_data.path / train / test)")
    root = image_root or path.parent
    seen: set[str] = set()
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            where = f"{path.name} line {number}"
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise RowSkip("bad_json", "not a JSON object")
                question, answer = _conversation(row)
                key = safe_key(row.get("id"), f"line{number}")
                if key in seen:  # several questions about one image often share its id
                    key = f"{key}-line{number}"
                images = images_of(row.get("image", row.get("images")), root)
                record = _record(key, images, question_of(question, len(images)), answer_of(answer),
                                 columns_of(row, {"image", "images", "conversations"}))
            except json.JSONDecodeError as err:
                skips.add("bad_json", f"{where}: {err}")
                continue
            except RowSkip as err:
                skips.add(err.reason, f"{where}: {err.detail}")
                continue
            seen.add(key)
            yield record


@dataclass(frozen=True)
class Columns:
    """Which columns of a table hold the image(s), the question and the answer."""

    image: str = "image"
    question: str = "question"
    answer: str = "answer"


def _check_columns(names: list[str], columns: Columns, where: str) -> None:
    missing = [c for c in (columns.image, columns.question, columns.answer) if c not in names]
    if missing:
        raise UserDataError(f"{where}: no column(s) {missing} (it has {names}); set data.user_data.image_column / "
                           "question_column / answer_column")


def read_rows(rows: Iterator[dict], where: str, columns: Columns, root: Path, skips: Skips) -> Iterator[Record]:
    """The usable records of a table's rows (dicts)."""
    seen: set[str] = set()
    for number, row in enumerate(rows):
        place = f"{where} row {number}"
        try:
            key = safe_key(row.get("id"), f"row{number}")
            if key in seen:
                key = f"{key}-row{number}"
            images = images_of(row.get(columns.image), root)
            record = _record(key, images, question_of(row.get(columns.question), len(images)),
                             answer_of(row.get(columns.answer)), columns_of(row, {columns.image}))
        except RowSkip as err:
            skips.add(err.reason, f"{place}: {err.detail}")
            continue
        seen.add(key)
        yield record


def _arrow_rows(tables: Iterator[Any]) -> Iterator[dict]:
    for table in tables:
        yield from table.to_pylist()


def dataset_splits(path: Path, columns: Columns) -> dict[str, tuple[str, Iterator[dict]]]:
    """{split: (where, rows)} of a `datasets` folder or parquet files; a Dataset or one file: {"all": ...}."""
    if path.is_file() and path.suffix == ".parquet":
        return {"all": _parquet(path, columns)}
    if path.is_file():
        raise UserDataError(f"{path}: a file that is neither a .jsonl (VLM-R1's lines) nor a .parquet file")
    if not path.is_dir():
        raise UserDataError(f"{path}: no such folder or parquet file (data.user_data.path / train / test)")
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        import datasets

        loaded = datasets.load_from_disk(str(path))
        parts = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"all": loaded}
        out = {}
        for name, part in parts.items():
            _check_columns(list(part.column_names), columns, f"{path} ({name})")
            out[name] = (f"{path.name}/{name}", _arrow_rows(part.with_format("arrow").iter(batch_size=64)))
        return out
    files = sorted(path.rglob("*.parquet"))
    if not files:
        raise UserDataError(f"{path}: neither a `datasets` save_to_disk folder nor a folder of parquet files")
    named: dict[str, list[Path]] = {}
    for file in files:
        stem = file.stem.lower()
        split = next((s for s in ("train", "test", "validation", "val") if stem.startswith(s)), "all")
        named.setdefault(split, []).append(file)
    if "all" in named and len(named) > 1:  # unnamed files beside named ones: all of them are one set
        named = {"all": files}
    return {split: _parquet_many(group, columns) for split, group in named.items()}


def _parquet(path: Path, columns: Columns) -> tuple[str, Iterator[dict]]:
    return _parquet_many([path], columns)


def _parquet_many(paths: list[Path], columns: Columns) -> tuple[str, Iterator[dict]]:
    """The rows of parquet files, streamed by `datasets` (local files: no download, no cache), images undecoded."""
    import datasets

    where = "+".join(p.name for p in paths)
    table = datasets.load_dataset("parquet", data_files=[str(p) for p in paths], split="train", streaming=True)
    _check_columns(list(table.column_names or []), columns, where)
    return where, iter(table.decode(False))
