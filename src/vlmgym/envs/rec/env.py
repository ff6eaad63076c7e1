"""rec: referring-expression comprehension, VLM-R1's headline task. Find the one object an expression describes
("the small red circle to the left of the blue square") and answer its box in Qwen3-VL's grounding JSON,
`[{"bbox_2d": [x1, y1, x2, y2], "label": "small red circle"}]`, coordinates 0-1000 relative to the image (boxes.py).

Data (data.py): synthetic scenes of nlvr2's shapes with expressions unambiguous by construction (the default), or
RefCOCO-family data from the hub; the truth is stored in 0-1000 units, so the shard stage's resizing leaves it right.

Reward, in [0, 1] for any text: format_weight x format_ok + (1 - format_weight) x IoU (format_weight:
`env.rec.format_weight`, 0.1 by default). IoU: of the first box in the answer with the true box, read tolerantly
(parse.py: extra text, swapped corners, floats, values clipped to 0-1000, a bare list or dict; several boxes: the
first is scored); a zero-area box scores 0. format_ok: the answer is exactly the JSON above, one box of integers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.config.spec import spec
from vlmgym.data.rows import SAFE_KEY, Row, RowSchema, RowSkip
from vlmgym.envs.base import Env, SampleLike, State
from vlmgym.envs.multiturn import ToolParams
from vlmgym.envs.nlvr2.data import COLOURS, RELATIONS, SHAPES, SIZES
from vlmgym.envs.rec import data as rec_data
from vlmgym.envs.rec import report
from vlmgym.envs.rec import scene as rec_scene
from vlmgym.envs.rec.boxes import SCALE, answer_json, iou, pixels_to_qwen
from vlmgym.envs.rec.parse import parse_answer
from vlmgym.envs.think import ThinkParams
from vlmgym.stats.bootstrap import Statistic
from vlmgym.stats.fields import record_field, record_where

ZOOM_CONTEXT = 1.0  # the ideal zoom's margin around the object, in units of its own width and height

# Qwen3-VL's grounding request with the answer's JSON spelled out. Kept short: with the tiny model's 12 image
# tokens and the chat template, the longest prompt fits the 128-token bucket (the old wording's needed 256, which
# doubled the cost of every SFT and GRPO step; tests/envs/test_prompt_buckets.py).
PROMPT = ('Locate "{expression}" and report its bbox coordinates in JSON format: '
          '[{{"bbox_2d": [x1, y1, x2, y2], "label": "..."}}], 0-1000 relative to the image.')
# the same request with the label first (env.rec.label_first), in the order the ideal answer then writes
LABEL_FIRST_PROMPT = ('Locate "{expression}" and report its bbox coordinates in JSON format: '
                      '[{{"label": "...", "bbox_2d": [x1, y1, x2, y2]}}], 0-1000 relative to the image.')
IOU_THRESHOLDS = (0.5, 0.75)  # accuracy at IoU >= 0.5 is RefCOCO's (and VLM-R1's) headline metric
# perception labels: per kind of object, none or the cell of a GRID_COLUMNS x GRID_ROWS grid holding its first
# object's centre (with 12 image tokens, about one token's patch of the tiny model's image per cell)
KINDS = tuple((size, colour, shape) for size in SIZES for colour in sorted(COLOURS) for shape in SHAPES)
GRID_COLUMNS, GRID_ROWS = 4, 3
# token labels: the centre's place in 0-1000 units, in bins this wide, so a token carries where its object is
POSITION_BIN = 50
POSITION_BINS = SCALE // POSITION_BIN
MAX_IMAGE_SIDE = 100_000  # a width or height beyond this in a raw row is a broken row, not an image


@dataclass(frozen=True)
class RecParams(ThinkParams, ToolParams):
    """rec reward: IoU plus a share for Qwen3-VL's answer format."""

    format_weight: float = spec(0.1, ge=0, le=1, doc="share of the reward for an answer in Qwen3-VL's form: a JSON "
                                                     "list of one bbox_2d of four integers 0-1000 (and a label)")
    label_first: bool = spec(True, doc="the prompt and the SFT target put the label (the object's whole "
                                       "description) before bbox_2d, so the box is written after the answer has "
                                       "named the object it looks up (false: Qwen3-VL's own order, bbox_2d first, "
                                       "for a pretrained checkpoint); the reward reads either order")


def parse_row(rec: dict[str, str]) -> Row:
    """One raw row (id, expression, label, pixel box, image size, image) as a sample whose truth is in 0-1000
    units; anything inconsistent is a counted skip."""
    sample_id = rec["id"].strip()
    if not SAFE_KEY.match(sample_id):
        raise RowSkip("bad_id", f"id {rec['id']!r} is not a plain token (letters, digits, _ and -)")
    expression = " ".join(rec["expression"].split())
    if not expression:
        raise RowSkip("missing_expression", "empty expression")
    label = " ".join(rec["label"].split())
    if not label:
        raise RowSkip("missing_label", "empty label")
    try:
        width, height = int(rec["width"]), int(rec["height"])
    except ValueError:
        width = height = 0
    if not (0 < width <= MAX_IMAGE_SIDE and 0 < height <= MAX_IMAGE_SIDE):
        raise RowSkip("bad_size", f"image size {rec['width']!r} x {rec['height']!r} is not two positive integers")
    try:
        box = [float(v) for v in rec["box"].split()]
    except ValueError:
        box = []
    if (len(box) != 4 or not all(math.isfinite(v) for v in box)
            or not (0 <= box[0] < box[2] <= width and 0 <= box[1] < box[3] <= height)):
        raise RowSkip("bad_box", f"box {rec['box']!r} is not 'x1 y1 x2 y2' with 0 <= x1 < x2 <= {width} and "
                                 f"0 <= y1 < y2 <= {height}")
    bbox = pixels_to_qwen(box, width, height)
    if bbox[0] >= bbox[2] or bbox[1] >= bbox[3]:
        raise RowSkip("degenerate_box", f"box {rec['box']!r} is under a thousandth of the {width}x{height} image")
    meta = {"id": sample_id, "expression": expression, "label": label, "bbox_2d": list(bbox)}
    objects = parse_objects(rec.get("objects") or "", width, height)
    if objects:
        meta["objects"] = objects
    return Row(sample_id, (rec["image"].strip(),), meta)


def parse_objects(text: str, width: int, height: int) -> list[list]:
    """The objects column as [size, colour, shape, x, y] with the centre relative to the image (0-1, four
    decimals); empty text is no objects, anything else malformed a counted skip."""
    objects = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        fields = item.split()
        try:
            x, y = (float(v) for v in fields[3:]) if len(fields) == 5 else (math.nan, math.nan)
        except ValueError:
            x = y = math.nan
        if (len(fields) != 5 or tuple(fields[:3]) not in KINDS or not (0 <= x <= width and 0 <= y <= height)):
            raise RowSkip("bad_objects", f"object {item!r} is not 'size colour shape x y' of a known kind inside the "
                                         f"{width}x{height} image")
        objects.append([*fields[:3], round(x / width, 4), round(y / height, 4)])
    return objects


def valid_box(value: Any) -> bool:
    """Four finite numbers in 0-1000 with x1 <= x2 and y1 <= y2 (a record's box, as JSON gives it back)."""
    return (isinstance(value, list | tuple) and len(value) == 4
            and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= SCALE
                    for v in value)
            and value[0] <= value[2] and value[1] <= value[3])


class RecEnv(Env):
    """Ground a referring expression in one image: answer the box of the object it describes; samples come from
    webdataset shards."""

    name = "rec"
    Params = RecParams
    DataParams = rec_data.RecDataParams
    schema = RowSchema("rec", rec_data.REQUIRED_COLUMNS, ("jpg",), parse_row)
    solved_metric = "accuracy_iou50"
    # docs/envs/rec.md, chosen on the val split: without the perception warm-up the tiny random tower never finds
    # the shapes and SFT boxes blind. At twice nlvr2's object size (at most 4 objects; test_ood 5-6, as many as
    # fit), the warm-up's token labels teach each image token the kind and the centre of the object it holds, the
    # label-first answer (env.rec.label_first) names the object before its box is written, and SFT from the frozen
    # tower learns to place the box. GRPO at a third of the default lr and temperature 0.6 (digits' and nlvr2's):
    # with the defaults no val step beat the SFT start; with these val was flat (one run).
    recipe = {"data": {"train_images": 24000,
                       "rec": {"object_scale": 2, "max_objects": 4, "ood_min_objects": 5, "ood_max_objects": 6}},
              "sft": {"steps": 3000, "freeze": "vision", "optimizer": {"lr": 0.001}, "validation": {"every": 250},
                      "perception": {"steps": 3000, "optimizer": {"lr": 0.001}}},
              "train": {"optimizer": {"lr": 3e-5}, "sampling": {"temperature": 0.6}}}
    metric_rows = {"mean_iou": ("mean IoU", "reward"),
                   **{f"accuracy_iou{round(100 * t)}": (f"accuracy at IoU {t}", "rate") for t in IOU_THRESHOLDS}}
    ood_note = ("crowded scenes of 7-9 objects (data.rec.ood_min_objects..ood_max_objects), more distractors than the "
                "2-5 of any train scene")

    def check_sample(self, sample: SampleLike) -> None:
        expression, box = sample.meta.get("expression"), sample.meta.get("bbox_2d")
        if not isinstance(expression, str) or not expression.strip():
            raise ValueError(f"rec: sample {sample.key} has no expression (meta {sample.meta!r})")
        if not valid_box(box) or not all(isinstance(v, int) for v in box) or box[0] >= box[2] or box[1] >= box[3]:
            raise ValueError(f"rec: sample {sample.key} has bbox_2d {box!r}, expected four integers 0-{SCALE} with "
                             "x1 < x2 and y1 < y2")

    @classmethod
    def describe_ood(cls, s: Any) -> str:
        """The configured crowding (data.rec.ood_min_objects..ood_max_objects against min_objects..max_objects)."""
        return (f"crowded scenes of {s.ood_min_objects}-{s.ood_max_objects} objects (data.rec.ood_min_objects.."
                f"ood_max_objects), more distractors than the {s.min_objects}-{s.max_objects} of any train scene")

    # one head per kind of object (size x colour x shape): none, or the grid cell of its first object's centre
    perception_heads = (1 + GRID_COLUMNS * GRID_ROWS,) * len(KINDS)

    @staticmethod
    def perception_labels(meta: dict[str, Any]) -> list[int]:
        """Per kind: 0 when the scene has none, else 1 + the cell (row-major) of its first object's centre."""
        labels = [0] * len(KINDS)
        for size, colour, shape, x, y in _scene(meta):
            kind = KINDS.index((size, colour, shape))
            if not labels[kind]:
                labels[kind] = 1 + _cell(x, y, GRID_ROWS, GRID_COLUMNS)
        return labels

    # for each merged image token: the kind of the object whose centre it holds (0: none, 1-24: KINDS) and that
    # centre's x and y bins (0: none, 1-POSITION_BINS), so a token carries what it shows and where, and the language
    # model can find the referred object by content and read its place off the same token
    perception_token_heads = (1 + len(KINDS), 1 + POSITION_BINS, 1 + POSITION_BINS)

    @staticmethod
    def perception_token_labels(meta: dict[str, Any], rows: int, cols: int) -> list[list[int]]:
        """(kind, x bin, y bin) per token, row by row; a token holding two centres keeps the first object's."""
        labels = [[0, 0, 0] for _ in range(rows * cols)]
        for size, colour, shape, x, y in _scene(meta):
            token = _cell(x, y, rows, cols)
            if not labels[token][0]:
                labels[token] = [1 + KINDS.index((size, colour, shape)), 1 + _position_bin(x), 1 + _position_bin(y)]
        return labels

    def prompt(self, sample: SampleLike) -> str:
        """The expression and the answer format."""
        return (LABEL_FIRST_PROMPT if self.params.label_first else PROMPT).format(expression=sample.meta["expression"])

    def prepare_truth(self, sample: SampleLike) -> tuple[int, int, int, int]:
        """The true box, 0-1000."""
        return tuple(sample.meta["bbox_2d"])

    def score(self, state: State, text: str) -> tuple[float, dict]:
        """format_weight x format_ok + (1 - format_weight) x IoU (module docstring); never raises."""
        truth = state.truth if state.truth is not None else tuple(state.meta["bbox_2d"])
        parsed = parse_answer(text)
        # rounded as the record keeps it, so the metrics recomputed from records match the reward
        box = None if parsed.box is None else tuple(round(v, 3) for v in parsed.box)
        overlap = iou(box, truth) if box is not None else 0.0
        weight = self.params.format_weight
        components = {"format": weight * parsed.format_ok, "iou": (1 - weight) * overlap}
        reward = min(1.0, max(0.0, components["format"] + components["iou"]))
        info = {
            "bbox_2d": None if box is None else list(box),
            "n_boxes": parsed.n_boxes,
            "iou": overlap,
            "format_ok": parsed.format_ok,
            "parse_failed": parsed.box is None,
            "reward_components": components,
        }
        return reward, info

    def ideal_answer(self, meta: dict[str, Any]) -> str:
        """The SFT target: `[{"bbox_2d": [x1, y1, x2, y2], "label": "<label>"}]` with the true box (the label first
        with env.rec.label_first)."""
        return answer_json(meta["bbox_2d"], meta["label"], label_first=self.params.label_first)

    def ideal_tool_calls(self, meta: dict[str, Any]) -> list[dict]:
        """With the zoom tool: one zoom onto the referred object with ZOOM_CONTEXT of its size around it on each
        side, then the answer, whose box stays in the whole image's coordinates."""
        if "zoom" not in {tool.name for tool in self.tools}:
            return []
        x1, y1, x2, y2 = meta["bbox_2d"]
        dx, dy = (x2 - x1) * ZOOM_CONTEXT, (y2 - y1) * ZOOM_CONTEXT
        box = (max(0, round(x1 - dx)), max(0, round(y1 - dy)), min(1000, round(x2 + dx)), min(1000, round(y2 + dy)))
        return [{"name": "zoom", "arguments": dict(zip(("x1", "y1", "x2", "y2"), box))}]

    @classmethod
    def corpus(cls) -> list[str]:
        """The prompt, the vocabulary, example expressions and answers, and every coordinate 0-1000 (tokenizer
        training)."""
        vocabulary = " ".join([*SIZES, *sorted(COLOURS), *SHAPES, "object", *RELATIONS])
        expressions = rec_scene.expression_corpus()
        labels = [f"{s} {c} {h}" for s in SIZES for c in sorted(COLOURS) for h in SHAPES]
        corners = [(i % 1001, (7 * i) % 1001, (13 * i) % 1001, (29 * i) % 1001) for i in range(200)]
        answers = [answer_json((min(a, c), min(b, d), max(a, c), max(b, d)), labels[i % len(labels)])
                   for i, (a, b, c, d) in enumerate(corners)]
        return [PROMPT.format(expression=""), vocabulary, *expressions, *answers,
                " ".join(str(n) for n in range(SCALE + 1))]

    @classmethod
    def write_synthetic(cls, data: Any, out_dir: Path) -> dict:
        """Scenes with referring expressions; `data.train_images` / `data.test_images` / `data.ood_images` count
        samples."""
        return rec_data.write_synthetic_raw(data, out_dir, cls.data_settings(data))

    @classmethod
    def download_hub(cls, data: Any, out_dir: Path) -> dict:
        """RefCOCO-family parquet from the hub (data.hub_repo, default lmms-lab/RefCOCO): its val split as train,
        its test split as test, the first train_images / test_images usable rows."""
        return rec_data.download_hub_raw(data, out_dir)

    @classmethod
    def record_fields(cls, info: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
        """What the parser read (the scored box, the box count, the IoU) and the truth (expression, label, box)."""
        return {"parsed": {"bbox_2d": info.get("bbox_2d"), "n_boxes": info.get("n_boxes"), "iou": info.get("iou")},
                "pred_box": info.get("bbox_2d"),
                "truth": {"expression": meta.get("expression"), "label": meta.get("label"),
                          "bbox_2d": list(meta.get("bbox_2d") or [])}}

    @classmethod
    def usable_prediction(cls, record: Mapping[str, Any]) -> bool:
        """An answer that held a box."""
        return valid_box(record.get("pred_box"))

    @classmethod
    def task_statistics(cls, records: Sequence[Mapping[str, Any]], **options: Any) -> dict[str, Statistic]:
        """Mean IoU with the true box (no box: 0) and the accuracy at IoU >= 0.5 and >= 0.75, per-sample arrays for
        the shared bootstrap, recomputed from each record's boxes."""
        overlaps = []
        for i, record in enumerate(records):
            where = record_where(record, i)
            truth = record_field(record, "truth", where)
            box = truth.get("bbox_2d") if isinstance(truth, Mapping) else None
            if not valid_box(box):
                raise ValueError(f"{where}: truth.bbox_2d must be four numbers 0-{SCALE} in order, got {box!r}")
            predicted = record.get("pred_box")
            overlaps.append(iou(predicted, box) if valid_box(predicted) else 0.0)
        overlaps = np.asarray(overlaps, np.float64)
        stats = {"mean_iou": Statistic("mean", overlaps)}
        for threshold in IOU_THRESHOLDS:
            stats[f"accuracy_iou{round(100 * threshold)}"] = Statistic("mean", (overlaps >= threshold).astype(float))
        return stats

    @classmethod
    def truth_text(cls, truth: Mapping[str, Any]) -> str:
        """The expression and the true box."""
        return f"{truth.get('expression')} -> {list(truth.get('bbox_2d') or [])}"

    @classmethod
    def outcome_text(cls, record: Mapping[str, Any]) -> str:
        """The IoU of the answer's box, or that it had none."""
        overlap = (record.get("parsed") or {}).get("iou")
        if not valid_box(record.get("pred_box")) or not isinstance(overlap, int | float):
            return "no box"
        return f"IoU {overlap:.2f}"

    @classmethod
    def gallery_images(cls, images: Sequence[Any], records: Mapping[str, Mapping[str, Any] | None]) -> list:
        """The sample's image with the true box and each policy's predicted box drawn on it (report.py)."""
        return [report.gallery_image(image, records) for image in images]

    @classmethod
    def report_html(cls, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], params: Any) -> str:
        """The legend of the boxes the gallery draws."""
        return report.legend_html(list(records_by_policy))


def _scene(meta: dict[str, Any]) -> list:
    """The sample's scene objects (size, colour, shape, x, y), or a stop naming the sample when it has none."""
    if not meta.get("objects"):
        raise ValueError(f"rec: sample {meta.get('id')!r} has no scene objects (the hub's rows carry none), so "
                         "sft.perception has no labels for it; set sft.perception.steps: 0")
    return meta["objects"]


def _cell(x: float, y: float, rows: int, cols: int) -> int:
    """The row-major cell of a rows x cols grid that holds the place (x, y), relative to the image (0-1)."""
    return min(int(y * rows), rows - 1) * cols + min(int(x * cols), cols - 1)


def _position_bin(relative: float) -> int:
    """The bin (0 to POSITION_BINS - 1) of a place relative to the image's side (0-1)."""
    return min(max(int(relative * SCALE) // POSITION_BIN, 0), POSITION_BINS - 1)
