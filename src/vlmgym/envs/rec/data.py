"""rec data: synthetic scenes with referring expressions (the default), or RefCOCO-family data from the hub.

Both write the rec raw layout that the shard stage reads:

    {raw}/{split}.csv             columns id,expression,label,box,width,height,image,objects
    {raw}/images/{split}/NN.zip   the jpgs named in the image column

`box` is the target's box in pixels of the image as stored in the zip, "x1 y1 x2 y2" (corners, y downwards);
`width` and `height` are that image's size, which the shard stage turns into Qwen3-VL's 0-1000 units (boxes.py)
before it resizes anything. `objects` lists the scene's objects, "size colour shape x y" (the centre in pixels)
joined by "; " (the perception warm-up's labels); the hub's rows leave it empty, and a CSV without the column
reads as empty.

Synthetic (scene.py): nlvr2's shapes, `data.rec.min_objects`..`max_objects` (2-5) per image, one of them the
target of an expression that fits it alone; the label is its whole description ("small red circle"). With
`data.ood_images` > 0, test_ood holds crowded scenes of `ood_min_objects`..`ood_max_objects` (7-9) objects, more
distractors than any train scene has. Everything is deterministic per (seed, split, index): a rerun writes
byte-identical files.

Hub: `lmms-lab/RefCOCO`-style parquet (question_id, image {bytes}, question, answer: the referring expressions,
bbox: [x, y, w, h] in COCO pixels, file_name, ...), through load_hub_split, the one network call. These copies are
evaluation sets without a train split: train takes the hub's `val` split and test its `test` split (RefCOCO splits
by image, so no image is in both). The first non-empty expression of a row is its question, and also its label
(the rows name no category); images are re-encoded as JPEG at their size; no test_ood.
"""

from __future__ import annotations

import io
import math
import random
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from vlmgym.config.sections import DataParams
from vlmgym.config.spec import ParamsError, spec
from vlmgym.data import layout
from vlmgym.envs.nlvr2.data import render_scene
from vlmgym.envs.rec import scene as rec_scene
from vlmgym.envs.rec.boxes import xywh_to_xyxy

CSV_COLUMNS = ("id", "expression", "label", "box", "width", "height", "image", "objects")
REQUIRED_COLUMNS = CSV_COLUMNS[:-1]  # objects is optional: the hub's rows and earlier raw data have no scene
IMAGES_PER_ZIP = 1_000  # a zip's images are held in memory until it is written (hub images are ~100-200 kB)
DEFAULT_HUB_REPO = "lmms-lab/RefCOCO"
HUB_SPLITS = {"train": "val", "test": "test"}  # the lmms-lab copies have val / test (/ testA / testB), no train
BOX_DECIMALS = 2



def check_object_counts(where: str, d: Any) -> None:
    """A data section's object counts (rec's, ovd's): each range in order, and test_ood more crowded than train."""
    if d.max_objects < d.min_objects:
        raise ParamsError(f"{where}: max_objects {d.max_objects} is below min_objects {d.min_objects}")
    if d.ood_max_objects < d.ood_min_objects:
        raise ParamsError(f"{where}: ood_max_objects {d.ood_max_objects} is below ood_min_objects {d.ood_min_objects}")
    if d.ood_min_objects <= d.max_objects:
        raise ParamsError(f"{where}: ood_min_objects {d.ood_min_objects} must be above max_objects "
                          f"{d.max_objects}, or test_ood would not be out of train's distribution")


def objects_of(d: Any, split: str) -> tuple[int, int]:
    """(fewest, most) objects per image of `split` in a data section with object counts."""
    if split == "test_ood":
        return d.ood_min_objects, d.ood_max_objects
    return d.min_objects, d.max_objects

@dataclass(frozen=True)
class RecDataParams:
    """rec's synthetic generator: how crowded the scenes are, how often expressions use a relation, and test_ood."""

    min_objects: int = spec(2, ge=1, le=rec_scene.MAX_OBJECTS, doc="objects per image at least (train and test)")
    max_objects: int = spec(5, ge=1, le=rec_scene.MAX_OBJECTS, doc="objects per image at most (train and test)")
    relation_share: float = spec(0.5, ge=0, le=1,
                                 doc="share of expressions naming a spatial relation to another object where both an "
                                     "attribute-only and a relational one fit (relations are only used when needed)")
    object_scale: float = spec(1.0, gt=0, le=4, doc="the shapes' radii relative to nlvr2's 6.5% / 11% (small / large) "
                                                     "of the image's shorter side, in every split (larger shapes "
                                                     "span more of the image tokens)")
    ood_min_objects: int = spec(7, ge=1, le=rec_scene.MAX_OBJECTS,
                                doc="objects per image at least in test_ood (data.ood_images; above max_objects, so "
                                    "train never shows such crowding)")
    ood_max_objects: int = spec(9, ge=1, le=rec_scene.MAX_OBJECTS, doc="objects per image at most in test_ood")

    def __post_init__(self) -> None:
        check_object_counts("data.rec", self)

    def objects(self, split: str) -> tuple[int, int]:
        """(fewest, most) objects per image of `split`."""
        return objects_of(self, split)


@dataclass(frozen=True)
class RawRecord:
    """One row of the raw layout with its encoded jpg; `box` in pixels of that image."""

    id: str
    expression: str
    label: str
    box: tuple[float, float, float, float]
    width: int
    height: int
    jpg: bytes
    objects: tuple[tuple[str, str, str, float, float], ...] = ()  # (size, colour, shape, x, y): the whole scene


def objects_text(objects: Iterable[tuple[str, str, str, float, float]]) -> str:
    """The objects column: "size colour shape x y" per object (centre in pixels, two decimals), joined by "; "."""
    return "; ".join(f"{size} {colour} {shape} {x:.{BOX_DECIMALS}f} {y:.{BOX_DECIMALS}f}"
                     for size, colour, shape, x, y in objects)


def box_text(box: Iterable[float]) -> str:
    """A pixel box as the CSV writes it: 'x1 y1 x2 y2', two decimals."""
    return " ".join(f"{v:.{BOX_DECIMALS}f}" for v in box)


def write_raw_split(out_dir: str | Path, split: str, records: Iterable[RawRecord]) -> int:
    """{split}.csv and images/{split}/NN.zip for `records` (zips written as they fill); returns the rows written."""
    items = (([r.id, r.expression, r.label, box_text(r.box), str(r.width), str(r.height), f"{r.id}.jpg",
               objects_text(r.objects)],
              [(f"{r.id}.jpg", r.jpg)]) for r in records)
    return layout.write_split(Path(out_dir), split, CSV_COLUMNS, items, IMAGES_PER_ZIP)


# --- synthetic -----------------------------------------------------------------------------


def generate_split(seed: int, split: str, count: int, width: int, height: int,
                   settings: RecDataParams | None = None) -> list[rec_scene.RecSample]:
    """`count` deterministic samples of `split` (scene descriptions, nothing rendered)."""
    settings = settings or RecDataParams()
    fewest, most = settings.objects(split)
    return [rec_scene.generate_sample(seed, split, i, width, height, fewest, most, settings.relation_share,
                                      settings.object_scale)
            for i in range(count)]


def render(sample: rec_scene.RecSample, seed: int, split: str, width: int, height: int) -> Image.Image:
    """The sample's image: nlvr2's renderer, with its own seeded background and noise."""
    return render_scene(sample.scene, width, height, random.Random(f"rec-render-{seed}-{split}-{sample.id}"))


def _synthetic_records(samples: list[rec_scene.RecSample], seed: int, split: str, width: int,
                       height: int) -> Iterator[RawRecord]:
    for sample in samples:
        jpg = layout.encode_jpeg(render(sample, seed, split, width, height))
        objects = tuple((o.size, o.colour, o.shape, o.x, o.y) for o in sample.scene)
        yield RawRecord(sample.id, sample.expression, sample.label, sample.box, width, height, jpg, objects)


def write_synthetic_raw(params: DataParams, out_dir: str | Path,
                        settings: RecDataParams | None = None) -> dict[str, Any]:
    """Write train_images / test_images samples (and ood_images of test_ood) into the raw layout; returns counts."""
    settings = settings or RecDataParams()
    splits = [("train", params.train_images), ("test", params.test_images)]
    if params.ood_images:
        splits.append(("test_ood", params.ood_images))
    counts: dict[str, Any] = {}
    for split, count in splits:
        samples = generate_split(params.seed, split, count, params.image_width, params.image_height, settings)
        records = _synthetic_records(samples, params.seed, split, params.image_width, params.image_height)
        counts[f"{split}_samples"] = write_raw_split(out_dir, split, records)
        counts[f"{split}_relational"] = sum(rec_scene.parse_expression(s.expression).relation is not None
                                            for s in samples)
    return counts


# --- RefCOCO-family data from the hub ------------------------------------------------------


def load_hub_split(repo: str, split: str) -> Any:
    """The one network call: stream a split of the hub dataset as rows of dicts."""
    import datasets

    return datasets.load_dataset(repo, split=split, streaming=True)


def first_expression(value: Any) -> str:
    """The first non-empty referring expression of a row's `answer` (a list of them, or one string), whitespace
    collapsed; '' when there is none."""
    candidates = [value] if isinstance(value, str) else list(value) if isinstance(value, list | tuple) else []
    for candidate in candidates:
        if isinstance(candidate, str) and candidate.strip():
            return " ".join(candidate.split())
    return ""


def hub_box(value: Any, width: int, height: int) -> tuple[float, float, float, float] | None:
    """A COCO [x, y, w, h] as pixel corners clipped to the image (COCO boxes may overrun by a fraction of a pixel);
    None for anything else, or a box with no area left inside the image."""
    try:
        x1, y1, x2, y2 = xywh_to_xyxy([float(v) for v in value])
    except (TypeError, ValueError):
        return None
    x1, x2 = max(0.0, x1), min(float(width), x2)
    y1, y2 = max(0.0, y1), min(float(height), y2)
    if not all(math.isfinite(v) for v in (x1, y1, x2, y2)) or x2 <= x1 or y2 <= y1:
        return None
    return x1, y1, x2, y2


def _decode_image(value: Any) -> Image.Image:
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict) and value.get("bytes"):
        return Image.open(io.BytesIO(value["bytes"]))
    raise ValueError(f"not an image: {type(value).__name__}")


def _hub_records(rows: Iterable[dict], split: str, limit: int, skipped: dict[str, int]) -> Iterator[RawRecord]:
    seen: set[str] = set()
    taken = 0
    for index, row in enumerate(rows):
        raw_id = str(row.get("question_id") or f"{split}-{index:06d}")
        row_id = re.sub(r"[^A-Za-z0-9_-]", "_", raw_id)  # no dots: webdataset splits sample names at dots
        expression = first_expression(row.get("answer"))
        reason, record = None, None
        if not expression:
            reason = "no_expression"
        elif row_id in seen:
            reason = "duplicate_id"
        else:
            try:
                image = _decode_image(row.get("image"))
                width, height = image.size
                box = hub_box(row.get("bbox"), width, height)
                if box is None:
                    reason = "bad_box"
                else:
                    record = RawRecord(row_id, expression, expression, box, width, height,
                                       layout.encode_jpeg(image))
            except (OSError, ValueError, Image.DecompressionBombError):
                reason = "bad_image"
        if record is None:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        seen.add(row_id)
        yield record
        taken += 1
        if taken >= limit:  # stop before pulling another row from a (streamed) split
            return


def download_hub_raw(params: DataParams, out_dir: str | Path,
                     load_fn: Callable[[str, str], Any] | None = None) -> dict[str, int]:
    """Convert the first train_images / test_images usable rows of the hub's val / test splits into the raw
    layout; returns counts (rows written, rows skipped by reason)."""
    load_fn = load_fn or load_hub_split
    repo = params.hub_repo or DEFAULT_HUB_REPO
    counts: dict[str, int] = {}
    for split, limit in (("train", params.train_images), ("test", params.test_images)):
        skipped: dict[str, int] = {}
        records = _hub_records(load_fn(repo, HUB_SPLITS[split]), split, limit, skipped)
        counts[f"{split}_samples"] = write_raw_split(out_dir, split, records)
        counts.update({f"{split}_skipped_{reason}": n for reason, n in sorted(skipped.items())})
    return counts
