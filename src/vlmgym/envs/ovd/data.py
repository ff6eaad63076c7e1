"""ovd data: synthetic scenes (the default; scene.py, rendered with rec's renderer), or a COCO-layout dataset.

Both write the ovd raw layout that the shard stage reads:

    {raw}/{split}.csv             columns id,categories,boxes,width,height,image,objects
    {raw}/images/{split}/NN.zip   the jpgs named in the image column

`categories` is the JSON list of the category names the question names, in prompt order; `boxes` the JSON list of
the truth, `[label, x1, y1, x2, y2]` in pixels of the image as stored (corners, y downwards), every object of a
named category; `width` and `height` that image's size (the shard stage turns the boxes into 0-1000 units).
`objects` is rec's scene column ("size colour shape x y" per object, vlmgym.envs.rec.data.objects_text), which the
perception warm-up reads; COCO rows leave it empty.

Synthetic: with data.ood_images > 0, test_ood holds crowded scenes of `ood_min_objects`..`ood_max_objects` (7-9)
objects, more than any train scene has (rec's shift), from the test pool of compositions.

COCO layout (data.source: hub, data.hub_repo a folder): `annotations/instances_{name}.json` and the images in
`{name}/` (file_name of each image entry), with train from `train2017` and test from `val2017` (HUB_SPLITS). Each
image with at least one (non-crowd) box becomes one sample: its question names `data.ovd.named` categories, half
(rounded up) among those the image shows and the rest among the dataset's categories it does not show
(categories with a crowd box in the image are named neither way); the truth is every non-crowd box of a named
category, clipped to the image. Images in id order, the first train_images / test_images usable ones; the choice
of categories is seeded by data.seed and the image id. No network: the folder must be there.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from vlmgym.config.sections import DataParams
from vlmgym.config.spec import spec
from vlmgym.data import layout
from vlmgym.envs.ovd import scene as ovd_scene
from vlmgym.envs.rec import data as rec_data

CSV_COLUMNS = ("id", "categories", "boxes", "width", "height", "image", "objects")
REQUIRED_COLUMNS = CSV_COLUMNS[:-1]
IMAGES_PER_ZIP = 1_000
HUB_SPLITS = {"train": "train2017", "test": "val2017"}
DEFAULT_HUB_DIR = "data/coco"


@dataclass(frozen=True)
class OvdDataParams:
    """ovd's synthetic generator: objects per scene, categories named per question, shape size."""

    min_objects: int = spec(2, ge=1, le=ovd_scene.MAX_OBJECTS, doc="objects per image at least")
    max_objects: int = spec(5, ge=1, le=ovd_scene.MAX_OBJECTS, doc="objects per image at most")
    named: int = spec(4, ge=1, le=len(ovd_scene.CATEGORIES),
                      doc="categories each question names: half (rounded up, at least one) shown in the image, the "
                          "rest absent from it (also for COCO-layout data)")
    object_scale: float = spec(1.0, gt=0, le=4, doc="the shapes' radii relative to nlvr2's (rec's object_scale)")
    ood_min_objects: int = spec(7, ge=1, le=ovd_scene.MAX_OBJECTS,
                                doc="objects per image at least in test_ood (data.ood_images; above max_objects)")
    ood_max_objects: int = spec(9, ge=1, le=ovd_scene.MAX_OBJECTS, doc="objects per image at most in test_ood")

    def __post_init__(self) -> None:
        rec_data.check_object_counts("data.ovd", self)

    def objects(self, split: str) -> tuple[int, int]:
        """(fewest, most) objects per image of `split`."""
        return rec_data.objects_of(self, split)


@dataclass(frozen=True)
class RawRecord:
    """One row of the raw layout with its encoded jpg; boxes in pixels of that image."""

    id: str
    categories: tuple[str, ...]
    boxes: tuple[tuple[str, tuple[float, float, float, float]], ...]
    width: int
    height: int
    jpg: bytes
    objects: str = ""


def boxes_text(boxes: Iterable[tuple[str, Iterable[float]]]) -> str:
    """The boxes column: JSON [[label, x1, y1, x2, y2], ...], two decimals."""
    return json.dumps([[label, *(round(float(v), rec_data.BOX_DECIMALS) for v in box)] for label, box in boxes])


def write_raw_split(out_dir: str | Path, split: str, records: Iterable[RawRecord]) -> int:
    """{split}.csv and images/{split}/NN.zip for `records`; returns the rows written."""
    items = (([r.id, json.dumps(list(r.categories)), boxes_text(r.boxes), str(r.width), str(r.height), f"{r.id}.jpg",
               r.objects], [(f"{r.id}.jpg", r.jpg)]) for r in records)
    return layout.write_split(Path(out_dir), split, CSV_COLUMNS, items, IMAGES_PER_ZIP)


# --- synthetic -----------------------------------------------------------------------------


def generate_split(seed: int, split: str, count: int, width: int, height: int,
                   settings: OvdDataParams | None = None) -> list[ovd_scene.OvdSample]:
    """`count` deterministic samples of `split` (nothing rendered)."""
    s = settings or OvdDataParams()
    fewest, most = s.objects(split)
    return [ovd_scene.generate_sample(seed, split, i, width, height, fewest, most, s.named, s.object_scale)
            for i in range(count)]


def _synthetic_records(samples: list[ovd_scene.OvdSample], seed: int, split: str, width: int,
                       height: int) -> Iterator[RawRecord]:
    for sample in samples:
        image = rec_data.render(sample, seed, f"ovd-{split}", width, height)  # rec's renderer, ovd's own noise seed
        objects = rec_data.objects_text((o.size, o.colour, o.shape, o.x, o.y) for o in sample.scene)
        yield RawRecord(sample.id, sample.categories, sample.objects, width, height, layout.encode_jpeg(image),
                        objects)


def write_synthetic_raw(params: DataParams, out_dir: str | Path, settings: OvdDataParams | None = None) -> dict:
    """train_images / test_images samples (and ood_images of test_ood) in the raw layout; returns counts."""
    counts: dict[str, Any] = {}
    splits = [("train", params.train_images), ("test", params.test_images)]
    if params.ood_images:
        splits.append(("test_ood", params.ood_images))
    for split, count in splits:
        samples = generate_split(params.seed, split, count, params.image_width, params.image_height, settings)
        records = _synthetic_records(samples, params.seed, split, params.image_width, params.image_height)
        counts[f"{split}_samples"] = write_raw_split(out_dir, split, records)
        counts[f"{split}_boxes"] = sum(len(s.objects) for s in samples)
    return counts


# --- COCO layout ---------------------------------------------------------------------------


def coco_records(root: Path, name: str, limit: int, seed: int, named: int,
                 skipped: dict[str, int]) -> Iterator[RawRecord]:
    """The first `limit` usable images of COCO split `name` under `root` as raw records (module docstring)."""
    annotations = json.loads((root / "annotations" / f"instances_{name}.json").read_text(encoding="utf-8"))
    names = {int(c["id"]): " ".join(str(c["name"]).split()) for c in annotations.get("categories", [])}
    by_image: dict[int, list[dict]] = {}
    for ann in annotations.get("annotations", []):
        by_image.setdefault(int(ann["image_id"]), []).append(ann)
    taken = 0
    for image in sorted(annotations.get("images", []), key=lambda im: int(im["id"])):
        image_id = int(image["id"])
        anns = [a for a in by_image.get(image_id, []) if int(a.get("category_id", -1)) in names]
        crowded = {names[int(a["category_id"])] for a in anns if a.get("iscrowd")}
        try:
            with Image.open(root / name / str(image["file_name"])) as opened:
                picture = opened.convert("RGB")
        except (OSError, ValueError, Image.DecompressionBombError):
            skipped["bad_image"] = skipped.get("bad_image", 0) + 1
            continue
        width, height = picture.size
        boxes = []
        for ann in anns:
            label = names[int(ann["category_id"])]
            box = rec_data.hub_box(ann.get("bbox"), width, height)
            if not ann.get("iscrowd") and label not in crowded and box is not None:
                boxes.append((label, box))
        present = sorted({label for label, _ in boxes})
        if not present:
            skipped["no_boxes"] = skipped.get("no_boxes", 0) + 1
            continue
        rng = random.Random(f"ovd-coco-{seed}-{name}-{image_id}")
        absent = [c for c in sorted(set(names.values())) if c not in present and c not in crowded]
        shown = rng.sample(present, max(1, min(len(present), (named + 1) // 2)))
        categories = shown + rng.sample(absent, min(len(absent), named - len(shown)))
        rng.shuffle(categories)
        kept = tuple(sorted(((label, box) for label, box in boxes if label in categories),
                            key=lambda item: (item[1][1], item[1][0])))
        yield RawRecord(f"coco{image_id}", tuple(categories), kept, width, height, layout.encode_jpeg(picture))
        taken += 1
        if taken >= limit:
            return


def coco_raw(params: DataParams, out_dir: str | Path, settings: OvdDataParams | None = None) -> dict[str, int]:
    """The raw layout from the COCO-layout folder data.hub_repo (default data/coco); returns counts."""
    settings = settings or OvdDataParams()
    root = Path(params.hub_repo or DEFAULT_HUB_DIR)
    if not (root / "annotations").is_dir():
        raise FileNotFoundError(f"ovd: data.hub_repo {str(root)!r} is no COCO-layout folder (annotations/"
                                f"instances_<split>.json and the images in <split>/); ovd downloads nothing itself")
    counts: dict[str, int] = {}
    for split, limit in (("train", params.train_images), ("test", params.test_images)):
        skipped: dict[str, int] = {}
        records = coco_records(root, HUB_SPLITS[split], limit, params.seed, settings.named, skipped)
        counts[f"{split}_samples"] = write_raw_split(out_dir, split, records)
        counts.update({f"{split}_skipped_{reason}": n for reason, n in sorted(skipped.items())})
    return counts
