"""The shard stage's image work (decode, upright, resize, re-encode: prepare_image) in a pool of processes, and the
ordered pool itself, which the synthetic generators' rendering uses too.

Results come back in task order whatever the worker count, and the tars are written by the calling process alone,
so the shards' bytes do not depend on `shard.workers` (tests/data/test_shard_workers.py). Tasks and results are
plain tuples of strings, ints and bytes: multiprocessing's own pipes carry them, no file format is involved.
"""

from __future__ import annotations

import io
import itertools
import math
import multiprocessing
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps

from vlmgym.data.layout import ZipReader

# What a bad image raises while it is read, decoded or re-encoded: the row is skipped and counted, not fatal.
IMAGE_ERRORS = (OSError, EOFError, zipfile.BadZipFile, zlib.error, ValueError, SyntaxError,
                Image.DecompressionBombError)
# Tasks handed to the pool at a time, per worker: enough to keep every worker busy, few enough that a capped split
# (shard.max_train / max_test) stops soon after its cap instead of preparing every remaining row.
TASKS_PER_WORKER = 32

Task = tuple[tuple[tuple[str, str], ...], int, int]  # ((zip path, member) per image of a row, max_pixels, quality)
Result = tuple[list[bytes] | None, str]  # (the row's images as JPEG bytes, "") or (None, "ErrorType: message")

MEMORY_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

_worker_reader: ZipReader | None = None  # one per worker process, so each zip is opened once per worker


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def prepare_image(data: bytes, max_pixels: int, quality: int) -> bytes:
    """Decode (fully, so truncation is caught), upright, convert to RGB, fit into max_pixels, re-encode as JPEG."""
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        image = ImageOps.exif_transpose(image).convert("RGB")
    width, height = image.size
    if width * height > max_pixels:
        scale = math.sqrt(max_pixels / (width * height))
        image = image.resize((max(1, int(width * scale)), max(1, int(height * scale))), Image.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def prepare_row(task: Task, reader: ZipReader | None = None) -> Result:
    """One row's images, read from their zips and prepared; a bad image gives (None, its error)."""
    global _worker_reader
    if reader is None:
        _worker_reader = _worker_reader or ZipReader()
        reader = _worker_reader
    members, max_pixels, quality = task
    try:
        return [prepare_image(reader.read(Path(path), member), max_pixels, quality)
                for path, member in members], ""
    except IMAGE_ERRORS as err:
        # PIL names the stream it failed on with its memory address: dropped, so the manifest that quotes the
        # error is the same bytes on every run.
        return None, f"{type(err).__name__}: {MEMORY_ADDRESS.sub('', str(err))}"


class OrderedPool:
    """`map(fn, items)` yields fn(item) for each item in item order, from `workers` processes (1: in this process);
    `fn` is a module-level function and items and results plain data, which multiprocessing's pipes carry.

    Used as a context manager; leaving it (also by an exception or a `break` at a cap) stops the workers."""

    def __init__(self, workers: int):
        self.workers = max(1, int(workers))
        self._pool = None

    def __enter__(self) -> ImagePool:
        if self.workers > 1:
            # spawn, not fork: the caller may hold threads (tqdm's monitor, a JAX runtime) that fork would copy
            # mid-state.
            self._pool = multiprocessing.get_context("spawn").Pool(self.workers)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        """fn(item) for each of `items`, in order."""
        if self._pool is None:
            yield from map(fn, items)
            return
        items, pending = iter(items), None
        while True:
            # The next block goes to the workers before this one's results are consumed, so they never wait for
            # the consumer (the tar or zip writer).
            block = list(itertools.islice(items, self.workers * TASKS_PER_WORKER))
            submitted = self._pool.imap(fn, block, chunksize=max(1, TASKS_PER_WORKER // 4)) if block else None
            if pending is not None:
                yield from pending
            if submitted is None:
                return
            pending = submitted


class ImagePool(OrderedPool):
    """`prepared(tasks)` yields each task's Result in task order (the shard stage's image work)."""

    def prepared(self, tasks: Iterable[Task]) -> Iterator[Result]:
        """The Results of `tasks`, in order."""
        if self._pool is None:
            with ZipReader() as reader:
                for task in tasks:
                    yield prepare_row(task, reader)
            return
        yield from self.map(prepare_row, tasks)
