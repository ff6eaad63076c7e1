"""ovd: open-vocabulary detection, VLM-R1's second headline task. The question names categories, some shown in
the image and some not; the answer lists every object of a named category as VLM-R1's (and Qwen's) JSON,
`[{"bbox_2d": [x1, y1, x2, y2], "label": "red circle"}, ...]`, coordinates 0-1000 relative to the image.

Data (data.py): synthetic scenes of rec's shapes (the default), or a COCO-layout folder. Reward (rewards.py):
`env.ovd.reward`, the default `f1` (a matching F1 that pays nothing for junk), or VLM-R1's `odLength`,
`weighted_sum` and `cosine` as published (vlm_r1.py). Metrics (metrics.py): COCO mAP@[.5:.95] and AP50 of the
split, the mean F1 and the exact-detection rate, each with its bootstrap interval. docs/envs/ovd.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.config.spec import spec
from vlmgym.data.rows import SAFE_KEY, Row, RowSchema, RowSkip
from vlmgym.envs.base import Env, SampleLike, State
from vlmgym.envs.ovd import data as ovd_data
from vlmgym.envs.ovd import report, vlm_r1
from vlmgym.envs.ovd.metrics import ap_statistics
from vlmgym.envs.ovd.parse import Detection, normal_label, parse_answer
from vlmgym.envs.ovd.rewards import OPTIONS, f1_reward
from vlmgym.envs.ovd.scene import CATEGORIES
from vlmgym.envs.rec.boxes import SCALE, pixels_to_qwen
from vlmgym.envs.rec.env import MAX_IMAGE_SIDE, RecEnv, parse_objects, valid_box
from vlmgym.envs.think import ThinkParams
from vlmgym.stats.bootstrap import Statistic
from vlmgym.stats.fields import record_field, record_where

PROMPT = ('Detect every object of these categories: {categories}. Answer in JSON: '
          '[{{"bbox_2d": [x1, y1, x2, y2], "label": "..."}}, ...], 0-1000 relative to the image.')


@dataclass(frozen=True)
class OvdParams(ThinkParams):
    """ovd reward: which of the options (docs/envs/ovd.md) scores an answer."""

    reward: str = spec("f1", choices=OPTIONS,
                       doc="f1: the matching F1 that pays nothing for junk (the default); odLength, weighted_sum, "
                           "cosine: VLM-R1's OVD rewards as published, quirks included (each pays some junk)")


def _json_list(text: str, what: str) -> list:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list):
        raise RowSkip(f"bad_{what}", f"{what} {text[:80]!r} is not a JSON list")
    return value


def parse_row(rec: dict[str, str]) -> Row:
    """One raw row (id, named categories, pixel boxes, image size, image) as a sample with its truth in 0-1000
    units; anything inconsistent is a counted skip."""
    sample_id = rec["id"].strip()
    if not SAFE_KEY.match(sample_id):
        raise RowSkip("bad_id", f"id {rec['id']!r} is not a plain token (letters, digits, _ and -)")
    categories = [normal_label(c) if isinstance(c, str) else "" for c in _json_list(rec["categories"], "categories")]
    if not categories or not all(categories) or len(set(categories)) != len(categories):
        raise RowSkip("bad_categories", f"categories {rec['categories'][:80]!r} are not distinct non-empty names")
    try:
        width, height = int(rec["width"]), int(rec["height"])
    except ValueError:
        width = height = 0
    if not (0 < width <= MAX_IMAGE_SIDE and 0 < height <= MAX_IMAGE_SIDE):
        raise RowSkip("bad_size", f"image size {rec['width']!r} x {rec['height']!r} is not two positive integers")
    boxes = []
    for item in _json_list(rec["boxes"], "boxes"):
        ok = isinstance(item, list) and len(item) == 5 and isinstance(item[0], str)
        values = item[1:] if ok else []
        ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values)
        if not ok or not (0 <= values[0] < values[2] <= width and 0 <= values[1] < values[3] <= height):
            raise RowSkip("bad_boxes", f"box {item!r} is not [label, x1, y1, x2, y2] inside the {width}x{height} image")
        label = normal_label(item[0])
        if label not in categories:
            raise RowSkip("unnamed_label", f"box label {item[0]!r} is none of the named categories {categories}")
        bbox = pixels_to_qwen(values, width, height)
        if bbox[0] >= bbox[2] or bbox[1] >= bbox[3]:
            raise RowSkip("degenerate_box", f"box {item!r} is under a thousandth of the {width}x{height} image")
        boxes.append({"bbox_2d": list(bbox), "label": label})
    meta: dict[str, Any] = {"id": sample_id, "categories": categories, "boxes": boxes}
    objects = parse_objects(rec.get("objects") or "", width, height)
    if objects:
        meta["objects"] = objects
    return Row(sample_id, (rec["image"].strip(),), meta)


def truths_of(meta: Mapping[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """The truth as (label, 0-1000 box) pairs."""
    return [(item["label"], tuple(item["bbox_2d"])) for item in meta.get("boxes") or []]


def _detections(record: Mapping[str, Any]) -> list[tuple[str, list[float]]]:
    boxes = record.get("pred_boxes")
    return [(item[0], item[1]) for item in boxes if isinstance(item, list | tuple) and len(item) == 2
            and isinstance(item[0], str) and valid_box(item[1])] if isinstance(boxes, list) else []


class OvdEnv(Env):
    """Detect every object of the named categories in one image; samples come from webdataset shards."""

    name = "ovd"
    Params = OvdParams
    DataParams = ovd_data.OvdDataParams
    schema = RowSchema("ovd", ovd_data.REQUIRED_COLUMNS, ("jpg",), parse_row)
    solved_metric = "exact"
    metric_rows = {"map": ("mAP (IoU 0.5:0.95)", "reward"), "ap50": ("AP50", "reward"),
                   "mean_f1": ("mean F1 (the default reward)", "reward"),
                   "exact": ("exact detection (all found, none extra)", "rate")}
    # rec's recipe (docs/envs/rec.md: the perception warm-up on the shapes, SFT from the frozen tower, GRPO at a
    # third of the default lr), with answers of up to four boxes, about 33 tokens each with the tiny tokenizer:
    # room for them in the token budgets. Untested for learning so far: docs/envs/ovd.md.
    recipe = {"data": {"train_images": 24000,
                       "ovd": {"object_scale": 2, "max_objects": 4, "ood_min_objects": 5, "ood_max_objects": 6}},
              "sft": {"steps": 3000, "max_target_tokens": 160, "freeze": "vision", "optimizer": {"lr": 0.001},
                      "validation": {"every": 250},
                      "perception": {"steps": 3000, "optimizer": {"lr": 0.001}}},
              "train": {"max_new_tokens": 160, "optimizer": {"lr": 3e-5}, "sampling": {"temperature": 0.6}},
              "rollout": {"max_new_tokens": 224}}  # test_ood's scenes hold up to 6 objects

    ood_note = ("crowded scenes of 7-9 objects (data.ovd.ood_min_objects..ood_max_objects), more than the 2-5 of any "
                "train scene")

    @classmethod
    def describe_ood(cls, s: Any) -> str:
        """The configured crowding."""
        return (f"crowded scenes of {s.ood_min_objects}-{s.ood_max_objects} objects (data.ovd.ood_min_objects.."
                f"ood_max_objects), more than the {s.min_objects}-{s.max_objects} of any train scene")

    # the perception warm-up reads rec's scene column, so rec's labels serve (the synthetic data only)
    perception_heads = RecEnv.perception_heads
    perception_labels = staticmethod(RecEnv.perception_labels)
    perception_token_heads = RecEnv.perception_token_heads
    perception_token_labels = staticmethod(RecEnv.perception_token_labels)

    def check_sample(self, sample: SampleLike) -> None:
        categories, boxes = sample.meta.get("categories"), sample.meta.get("boxes")
        if not (isinstance(categories, list) and categories and all(isinstance(c, str) and c for c in categories)):
            raise ValueError(f"ovd: sample {sample.key} names no categories (meta {sample.meta!r})")
        for item in boxes if isinstance(boxes, list) else [None]:
            box = item.get("bbox_2d") if isinstance(item, dict) else None
            if not (valid_box(box) and item.get("label") in categories):
                raise ValueError(f"ovd: sample {sample.key} has box {item!r}, expected a bbox_2d of four numbers "
                                 f"0-{SCALE} in order and a label among {categories}")

    def prompt(self, sample: SampleLike) -> str:
        """The named categories and the answer format."""
        return PROMPT.format(categories=", ".join(sample.meta["categories"]))

    def prepare_truth(self, sample: SampleLike) -> list[tuple[str, tuple[int, ...]]]:
        return truths_of(sample.meta)

    def count_tokens(self, text: str) -> int:
        """The answer's length for the cosine option: the tokenizer's count, else UTF-8 bytes."""
        if self.tokenizer is not None:
            encoded = self.tokenizer.encode(text)
            return len(getattr(encoded, "ids", encoded))
        return len(text.encode("utf-8", "replace"))

    def score(self, state: State, text: str) -> tuple[float, dict]:
        """The configured reward option (rewards.py, vlm_r1.py); never raises."""
        text = text if isinstance(text, str) else ""
        truths = state.truth if state.truth is not None else truths_of(state.meta)
        parsed = parse_answer(text)
        f1, found = f1_reward(parsed.detections, parsed.n_items, parsed.read, truths)
        option = self.params.reward
        if option == "f1":
            reward = f1
        elif option == "odLength":
            reward = vlm_r1.od_length(text, truths)
        elif option == "weighted_sum":
            reward = vlm_r1.weighted_sum(text, truths)
        else:
            reward = vlm_r1.cosine(text, self.count_tokens)
        reward = min(1.0, max(0.0, reward)) if math.isfinite(reward) else 0.0
        detections = [[d.label, [round(v, 3) for v in d.box]] for d in parsed.detections if d.box is not None]
        return reward, {"detections": detections if parsed.read else None, "n_items": parsed.n_items,
                        "found": found, "f1": f1, "format_ok": parsed.format_ok, "parse_failed": not parsed.read,
                        "reward_components": {option: reward}}

    def ideal_answer(self, meta: dict[str, Any]) -> str:
        """The SFT target: the true list (`[]` when nothing named is shown); for VLM-R1's options its form, the
        list in a ```json fence (`None` for nothing)."""
        items = [{"bbox_2d": list(box), "label": label} for label, box in truths_of(meta)]
        if self.params.reward == "f1":
            return json.dumps(items)
        return f"```json\n{json.dumps(items)}\n```" if items else "None"

    @classmethod
    def corpus(cls) -> list[str]:
        """Prompts, category names, example answers and every coordinate 0-1000 (tokenizer training)."""
        prompts = [PROMPT.format(categories=", ".join(CATEGORIES[i::3])) for i in range(3)]
        corners = [(i % 1001, (7 * i) % 1001, (13 * i) % 1001, (29 * i) % 1001) for i in range(120)]
        answers = [json.dumps([{"bbox_2d": [min(a, c), min(b, d), max(a, c), max(b, d)],
                                "label": CATEGORIES[(i + k) % len(CATEGORIES)]} for k in range(1 + i % 3)])
                   for i, (a, b, c, d) in enumerate(corners)]
        return [*prompts, " ".join(CATEGORIES), *answers, " ".join(str(n) for n in range(SCALE + 1))]

    @classmethod
    def write_synthetic(cls, data: Any, out_dir: Path) -> dict:
        """Scenes of rec's shapes with detection questions (train_images / test_images samples)."""
        return ovd_data.write_synthetic_raw(data, out_dir, cls.data_settings(data))

    @classmethod
    def download_hub(cls, data: Any, out_dir: Path) -> dict:
        """A COCO-layout folder (data.hub_repo, default data/coco): val2017 as test, train2017 as train."""
        return ovd_data.coco_raw(data, out_dir, cls.data_settings(data))

    # --- evaluation ---

    @classmethod
    def record_fields(cls, info: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
        """The boxes read ([label, box] each; None: no list read), the items listed, the F1; the truth
        (categories, boxes)."""
        return {"parsed": {"n_items": info.get("n_items"), "found": info.get("found"), "f1": info.get("f1")},
                "pred_boxes": info.get("detections"),
                "truth": {"categories": list(meta.get("categories") or []), "boxes": list(meta.get("boxes") or [])}}

    @classmethod
    def usable_prediction(cls, record: Mapping[str, Any]) -> bool:
        """An answer that listed at least one box."""
        return bool(_detections(record))

    @classmethod
    def task_statistics(cls, records: Sequence[Mapping[str, Any]], **options: Any) -> dict[str, Statistic]:
        """The split's COCO mAP and AP50 (metrics.py), the mean F1 (the default reward) and the exact-detection
        rate, recomputed from each record's boxes."""
        images, f1s, exact = [], [], []
        for i, record in enumerate(records):
            where = record_where(record, i)
            truth = record_field(record, "truth", where)
            boxes = truth.get("boxes") if isinstance(truth, Mapping) else None
            if not isinstance(boxes, list) or not all(isinstance(b, Mapping) and valid_box(b.get("bbox_2d"))
                                                      for b in boxes):
                raise ValueError(f"{where}: truth.boxes must be a list of bbox_2d boxes 0-{SCALE}, got {boxes!r}")
            truths = truths_of(truth)
            detections = _detections(record)
            n_items = (record.get("parsed") or {}).get("n_items")
            n_items = n_items if isinstance(n_items, int) and n_items >= len(detections) else len(detections)
            f1, found = f1_reward([Detection(label, tuple(box)) for label, box in detections], n_items,
                                  isinstance(record.get("pred_boxes"), list), truths)
            images.append((truths, detections))
            f1s.append(f1)
            exact.append(float(found == len(truths) == n_items))
        return {**ap_statistics(images), "mean_f1": Statistic("mean", np.asarray(f1s, np.float64)),
                "exact": Statistic("mean", np.asarray(exact, np.float64))}

    @classmethod
    def truth_text(cls, truth: Mapping[str, Any]) -> str:
        """The named categories and the true boxes."""
        boxes = "; ".join(f"{b.get('label')} {b.get('bbox_2d')}" for b in truth.get("boxes") or [])
        return f"{', '.join(truth.get('categories') or [])} -> {boxes or 'none'}"

    @classmethod
    def outcome_text(cls, record: Mapping[str, Any]) -> str:
        """Boxes listed, found with the right label, and the F1."""
        parsed = record.get("parsed") or {}
        if not isinstance(record.get("pred_boxes"), list):
            return "no list"
        f1 = parsed.get("f1")
        return (f"{parsed.get('found')} found of {len(_detections(record))} boxes"
                + (f", F1 {f1:.2f}" if isinstance(f1, int | float) else ""))

    @classmethod
    def gallery_images(cls, images: Sequence[Any], records: Mapping[str, Mapping[str, Any] | None]) -> list:
        """The sample's image with the true boxes and each policy's predicted boxes drawn on it."""
        return [report.gallery_image(image, records) for image in images]

    @classmethod
    def report_html(cls, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], params: Any) -> str:
        """The legend of the boxes the gallery draws."""
        return report.legend_html(list(records_by_policy))
