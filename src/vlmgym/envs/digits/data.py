"""digits data: real handwritten digits (scikit-learn's bundled copy of the UCI digits) composed onto a canvas.

Writes the digits raw layout that the shard stage reads:

    {raw}/{split}.csv             columns id,task,digits,answer,image
    {raw}/images/{split}/NN.zip   the jpgs named in the image column

Each image holds 1 to `data.digits.max_digits` handwritten digits, each upscaled smoothly to a random height
(`min_scale`..`max_scale` pixels) and placed without overlap, dark ink on a light, noisy background. Each sample
asks either to sort the digits (answer "1, 3, 7") or to add them (answer "11"); the two tasks alternate in a
seeded order, so each split is balanced. `digits` lists the digits left to right as drawn.

The 1,797 8x8 scans are split once, by a hash of their index (about 80/20), into a train pool and a test pool:
train images use only train-pool scans and test / test_ood images only test-pool ones, so a policy never sees a
test digit's handwriting in training. With `data.ood_images` > 0, test_ood draws test-pool digits with a shift
train never shows (`data.digits.ood_shift`: inverted colours, light ink on a dark background, by default; or
digits rotated 20-40 degrees either way).

Everything is deterministic per (seed, split, index): a rerun writes byte-identical files.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vlmgym.config.sections import DataParams
from vlmgym.config.spec import ParamsError, spec
from vlmgym.data import layout
from vlmgym.data.image_pool import OrderedPool, available_cores

TASKS = ("sort", "sum")
MAX_DIGITS = 4  # the most a canvas holds; metric_rows has a row per count up to this
REQUIRED_COLUMNS = ("id", "task", "digits", "answer", "image")
# where the digits are, as Qwen3-VL's 0-1000 box "x1 y1 x2 y2" around all of them with a margin: the region an ideal
# zoom shows (vlmgym.envs.multiturn); optional when reading, so raw data written without it still loads
CSV_COLUMNS = (*REQUIRED_COLUMNS, "region")
REGION_MARGIN = 0.25  # of the digits' own extent, on each side
IMAGES_PER_ZIP = 10_000
# a rendering process costs about a second to start (numpy, PIL, the scans): worth it past this many images each
MIN_IMAGES_PER_WORKER = 2000
TEST_POOL_PERCENT = 20
OOD_SHIFTS = ("invert", "rotate")
ROTATE_DEGREES = (20.0, 40.0)
# Placement tries per digit before every digit of the image is shrunk by SHRINK and placed again: only a canvas
# too small for the scale range needs it, and shrinking always ends in a fit.
PLACE_TRIES = 100
SHRINK = 0.8
MIN_DIGIT_PIXELS = 8


@dataclass(frozen=True)
class DigitsDataParams:
    """digits' generator: how many digits per image, how large, and the shift of the test_ood split."""

    max_digits: int = spec(3, ge=1, le=MAX_DIGITS, doc="digits per image at most (1 to this many, uniformly)")
    min_scale: int = spec(24, ge=MIN_DIGIT_PIXELS, le=1024, doc="smallest digit height in pixels")
    max_scale: int = spec(64, ge=MIN_DIGIT_PIXELS, le=1024, doc="largest digit height in pixels (>= min_scale)")
    ood_shift: str = spec("invert", choices=OOD_SHIFTS,
                          doc="what test_ood shifts: invert (light ink on a dark background) or rotate (each digit "
                              "turned 20-40 degrees either way); train and test show neither")

    def __post_init__(self) -> None:
        if self.max_scale < self.min_scale:
            raise ParamsError(f"data.digits: max_scale {self.max_scale} is below min_scale {self.min_scale}")


@functools.cache
def _scans() -> tuple[np.ndarray, np.ndarray]:
    """The UCI digits as (images (1797, 8, 8) in [0, 1], labels): bundled with scikit-learn, no network."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.asarray(bunch.images, np.float64) / 16.0, np.asarray(bunch.target, np.int64)


def in_test_pool(index: int) -> bool:
    """Whether scan `index` belongs to the test pool: a hash of the index alone, so the pools never depend on the
    seed and never overlap."""
    digest = hashlib.sha256(f"digits-pool-{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < TEST_POOL_PERCENT


@functools.cache
def pool(split: str) -> tuple[int, ...]:
    """Scan indices usable by `split`: the train pool for train, the test pool for test and test_ood."""
    test = split != "train"
    return tuple(i for i in range(len(_scans()[1])) if in_test_pool(i) == test)


def answer_text(task: str, digits: list[int]) -> str:
    """The canonical answer: the digits ascending, comma-separated ("1, 3, 7"), or their sum ("11")."""
    if task == "sort":
        return ", ".join(str(d) for d in sorted(digits))
    if task == "sum":
        return str(sum(digits))
    raise ValueError(f"digits: unknown task {task!r}; known: {TASKS}")


@dataclass(frozen=True)
class DigitsSample:
    """One generated sample: which scans, where they go (x, y, height, angle) and the question."""

    id: str
    task: str
    digits: tuple[int, ...]  # left to right
    scans: tuple[int, ...]
    boxes: tuple[tuple[int, int, int, float], ...]

    @property
    def answer(self) -> str:
        return answer_text(self.task, list(self.digits))

    def region(self, width: int, height: int) -> tuple[int, int, int, int]:
        """The 0-1000 box around every digit, widened by REGION_MARGIN of its extent on each side."""
        x1 = min(x for x, _, _, _ in self.boxes)
        y1 = min(y for _, y, _, _ in self.boxes)
        x2 = max(x + size for x, _, size, _ in self.boxes)
        y2 = max(y + size for _, y, size, _ in self.boxes)
        dx, dy = (x2 - x1) * REGION_MARGIN, (y2 - y1) * REGION_MARGIN
        return (max(0, round((x1 - dx) / width * 1000)), max(0, round((y1 - dy) / height * 1000)),
                min(1000, round((x2 + dx) / width * 1000)), min(1000, round((y2 + dy) / height * 1000)))


def balanced_tasks(count: int, seed: int, split: str) -> list[str]:
    """Half sort, half sum (sort gets the odd one), in a seeded order."""
    tasks = [TASKS[i % 2] for i in range(count)]
    random.Random(f"digits-tasks-{seed}-{split}").shuffle(tasks)
    return tasks


def _place(rng: random.Random, heights: list[int], width: int, height: int) -> list[tuple[int, int, int]]:
    """Non-overlapping square boxes (x, y, size) for digits of the given sizes, shrinking them until they fit."""
    sizes = [max(MIN_DIGIT_PIXELS, min(h, width, height)) for h in heights]
    while True:
        boxes: list[tuple[int, int, int]] = []
        for size in sizes:
            for _ in range(PLACE_TRIES):
                x, y = rng.randint(0, width - size), rng.randint(0, height - size)
                if all(x + size <= bx or bx + bs <= x or y + size <= by or by + bs <= y for bx, by, bs in boxes):
                    boxes.append((x, y, size))
                    break
            else:
                break
        if len(boxes) == len(sizes):
            return boxes
        if max(sizes) <= MIN_DIGIT_PIXELS:
            raise ValueError(f"digits: {len(sizes)} digits of {MIN_DIGIT_PIXELS} px do not fit on a "
                             f"{width}x{height} canvas")
        sizes = [max(MIN_DIGIT_PIXELS, int(s * SHRINK)) for s in sizes]


def generate_sample(seed: int, split: str, index: int, task: str, width: int, height: int,
                    settings: DigitsDataParams) -> DigitsSample:
    """One sample's description (nothing rendered): digit count, scans from the split's pool, boxes, angles."""
    rng = random.Random(f"digits-{seed}-{split}-{index}")
    count = rng.randint(1, settings.max_digits)
    candidates = pool(split)
    scans = [candidates[rng.randrange(len(candidates))] for _ in range(count)]
    heights = [rng.randint(settings.min_scale, settings.max_scale) for _ in range(count)]
    boxes = _place(rng, heights, width, height)
    rotate = split == "test_ood" and settings.ood_shift == "rotate"
    angles = [rng.choice((-1, 1)) * rng.uniform(*ROTATE_DEGREES) if rotate else 0.0 for _ in range(count)]
    # left to right (then top to bottom), the order a reader lists them in
    order = sorted(range(count), key=lambda i: (boxes[i][0], boxes[i][1]))
    labels = _scans()[1]
    return DigitsSample(f"{split}-{index:06d}", task, tuple(int(labels[scans[i]]) for i in order),
                        tuple(scans[i] for i in order), tuple((*boxes[i], angles[i]) for i in order))


def generate_split(seed: int, split: str, count: int, width: int, height: int,
                   settings: DigitsDataParams | None = None) -> list[DigitsSample]:
    """`count` deterministic samples of `split`, balanced between the tasks."""
    settings = settings or DigitsDataParams()
    tasks = balanced_tasks(count, seed, split)
    return [generate_sample(seed, split, i, tasks[i], width, height, settings) for i in range(count)]


def render(sample: DigitsSample, seed: int, split: str, width: int, height: int,
           settings: DigitsDataParams | None = None) -> Image.Image:
    """The sample's RGB image: each scan upscaled bicubically into its box over a light noisy background (dark
    for test_ood under the invert shift)."""
    settings = settings or DigitsDataParams()
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(f"digits-render-{seed}-{split}-{sample.id}"
                                                              .encode()).digest()[:8], "big"))
    paper = rng.uniform(215, 245, 3)
    ink = rng.uniform(10, 70, 3)
    canvas = np.broadcast_to(paper, (height, width, 3)).copy()
    images = _scans()[0]
    for scan, (x, y, size, angle) in zip(sample.scans, sample.boxes):
        glyph = Image.fromarray((images[scan] * 255).astype(np.uint8), "L").resize((size, size), Image.BICUBIC)
        if angle:  # same box size, so placement stays non-overlapping; the 8x8 scans have empty margins
            glyph = glyph.rotate(angle, resample=Image.BICUBIC)
        alpha = np.asarray(glyph, np.float64)[..., None] / 255.0
        region = canvas[y:y + size, x:x + size]
        canvas[y:y + size, x:x + size] = region * (1 - alpha) + ink * alpha
    canvas += rng.normal(0, 8, canvas.shape)
    if split == "test_ood" and settings.ood_shift == "invert":
        canvas = 255 - canvas
    return Image.fromarray(canvas.clip(0, 255).round().astype(np.uint8), "RGB")


def _rendered_row(task: tuple) -> tuple[list[str], list[tuple[str, bytes]]]:
    """One sample's CSV row and JPEG, from plain data (a pool worker's task): (sample fields, seed, split, width,
    height, settings fields)."""
    fields, seed, split, width, height, settings = task
    s = DigitsSample(*fields)
    image = layout.encode_jpeg(render(s, seed, split, width, height, DigitsDataParams(**settings)))
    return ([s.id, s.task, " ".join(map(str, s.digits)), s.answer, f"{s.id}.jpg",
             " ".join(map(str, s.region(width, height)))], [(f"{s.id}.jpg", image)])


def write_raw_split(out_dir: Path, split: str, samples: list[DigitsSample], seed: int, width: int, height: int,
                    settings: DigitsDataParams, workers: int = 1) -> int:
    """{split}.csv and images/{split}/NN.zip for `samples`, rendered by `workers` processes (each image is seeded
    by its sample alone, so the bytes do not depend on them); returns the rows written."""
    plain = dataclasses.asdict(settings)
    tasks = ((dataclasses.astuple(s), seed, split, width, height, plain) for s in samples)
    with OrderedPool(workers) as renderers:
        return layout.write_split(out_dir, split, CSV_COLUMNS, renderers.map(_rendered_row, tasks), IMAGES_PER_ZIP)


def write_synthetic_raw(params: DataParams, out_dir: str | Path,
                        settings: DigitsDataParams | None = None) -> dict[str, Any]:
    """Write train_images / test_images samples (and ood_images of test_ood) into the raw layout; returns counts."""
    settings = settings or DigitsDataParams()
    out_dir = Path(out_dir)
    splits = [("train", params.train_images), ("test", params.test_images)]
    if params.ood_images:
        splits.append(("test_ood", params.ood_images))
    counts: dict[str, Any] = {"train_pool": len(pool("train")), "test_pool": len(pool("test"))}
    workers = min(available_cores(), max(1, sum(count for _, count in splits) // MIN_IMAGES_PER_WORKER))
    for split, count in splits:
        samples = generate_split(params.seed, split, count, params.image_width, params.image_height, settings)
        counts[f"{split}_samples"] = write_raw_split(out_dir, split, samples, params.seed, params.image_width,
                                                     params.image_height, settings, workers)
        counts[f"{split}_sort"] = sum(s.task == "sort" for s in samples)
    return counts
