"""Reading detections out of a model's answer: tolerant for the score, strict for the format flag; never raises.

The answer is a JSON list of `{"bbox_2d": [x1, y1, x2, y2], "label": "..."}` (VLM-R1's and Qwen's grounding form,
coordinates 0-1000 relative to the image: vlmgym.envs.rec.boxes). parse_answer reads:
- the text outside `<think>...</think>` blocks (an unclosed one runs to the end), its first MAX_ANSWER_CHARS
  characters;
- inside a ```json fence when there is one (the first), else the whole text, else the span from its first `[` to
  its last `]`; a single object reads as a list of one;
- every item of the list is one detection (`n_items`, all of them: extra items are false positives); an item
  with a `bbox_2d` of four finite numbers and a non-empty string `label` is a box (clipped to 0-1000, corners put
  in order, the label lower-cased with its whitespace collapsed), anything else a detection of nothing (no box).
  Only the first MAX_ITEMS items are read (COCO's 100 detections per image), the rest still count.
format_ok: the whole answer (give or take whitespace and one ```json fence) is a non-empty JSON list of objects
with exactly `bbox_2d` (four integers 0-1000, x1 <= x2, y1 <= y2) and a string `label`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from vlmgym.envs.rec.boxes import SCALE, Box, ordered

MAX_ANSWER_CHARS = 20_000
MAX_ITEMS = 100  # COCO's maxDets: the detections of an image that count
THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)
FENCE = re.compile(r"```(?:json)?(.*?)```", re.DOTALL)
KEYS = {"bbox_2d", "label"}


@dataclass(frozen=True)
class Detection:
    """One item of the answer: its label and box (None when the item is no labelled box)."""

    label: str | None
    box: Box | None


@dataclass(frozen=True)
class ParsedAnswer:
    """The detections read (the first MAX_ITEMS items), how many items the list has, whether a list was read at
    all, and whether the answer is exactly the canonical form."""

    detections: tuple[Detection, ...]
    n_items: int
    read: bool
    format_ok: bool


def normal_label(label: str) -> str:
    """A label as compared with the truth's: lower case, whitespace collapsed."""
    return " ".join(label.lower().split())


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def _loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_list(text: str) -> list | None:
    """The answer's JSON list (module docstring), or None."""
    body = THINK.sub(" ", text[:MAX_ANSWER_CHARS]).strip()
    fence = FENCE.search(body)
    if fence:
        body = fence.group(1).strip()
    value = _loads(body)
    if value is None and "[" in body and "]" in body:
        value = _loads(body[body.index("["):body.rindex("]") + 1])
    if isinstance(value, dict):
        value = [value]
    return value if isinstance(value, list) else None


def detection(item: Any) -> Detection:
    """One list item as a detection: a box when it holds a bbox_2d of four finite numbers and a label."""
    if not isinstance(item, dict):
        return Detection(None, None)
    box, label = item.get("bbox_2d"), item.get("label")
    if not (isinstance(box, list) and len(box) == 4 and all(map(_number, box))
            and isinstance(label, str) and normal_label(label)):
        return Detection(None, None)
    clipped = ordered(tuple(min(float(SCALE), max(0.0, float(v))) for v in box))
    return Detection(normal_label(label), clipped)


def is_canonical(text: str) -> bool:
    """Whether the answer is exactly the canonical list (module docstring)."""
    body = text.strip()
    if body.startswith("```"):
        match = re.fullmatch(r"```(?:json)?(.*)```", body, re.DOTALL)
        if match is None:
            return False
        body = match.group(1)
    value = _loads(body) if len(body) <= MAX_ANSWER_CHARS else None
    if not (isinstance(value, list) and 0 < len(value) <= MAX_ITEMS):
        return False
    for item in value:
        if not (isinstance(item, dict) and set(item) == KEYS and isinstance(item["label"], str)):
            return False
        box = item["bbox_2d"]
        if not (isinstance(box, list) and len(box) == 4
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= SCALE for v in box)
                and box[0] <= box[2] and box[1] <= box[3]):
            return False
    return True


def parse_answer(text: Any) -> ParsedAnswer:
    """The detections of an answer (anything not a string reads as empty); never raises."""
    text = text if isinstance(text, str) else ""
    items = read_list(text)
    if items is None:
        return ParsedAnswer((), 0, False, False)
    return ParsedAnswer(tuple(detection(item) for item in items[:MAX_ITEMS]), len(items), True, is_canonical(text))
