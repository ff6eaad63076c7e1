"""Reading a box out of a model's answer: tolerant for the score, strict for the format flag; never raises.

The box scored (parse_answer):
- the first bracketed list of four numbers in the answer, `[x1, y1, x2, y2]`, wherever it is: inside the canonical
  `[{"bbox_2d": [...], "label": "..."}]`, a bare dict `{"bbox_2d": [...]}`, a bare list, a ```json fence, or
  with text around it. Numbers may be integers or floats (signs and exponents allowed);
- clipped to 0-1000 (so -5 reads as 0 and 1e9 as 1000), then its corners put in order (x1 <= x2, y1 <= y2), so
  swapped corners score like the right ones; a number too large for a float (1e309, a 400-digit one) makes the
  list no box, since clipping infinities would read junk like `[-1e309, -1e309, 1e309, 1e309]` as the whole
  image;
- outside `<think>...</think>` blocks (an unclosed one runs to the end): reasoning is not the answer;
- several boxes: only the first is scored; `n_boxes` counts them all (up to MAX_BOXES_COUNTED) and the format flag
  is off, since the question asks for one object;
- nothing else: lists of another length, `(x1, y1, x2, y2)` in parentheses, NaN or words read as no box.
Only the first MAX_ANSWER_CHARS characters are read, so a megabyte of junk costs no more than that.

format_ok: the whole answer (give or take whitespace and one ```json fence) is exactly Qwen3-VL's form, a JSON list
of one object with `bbox_2d`, four integers 0-1000 with x1 <= x2 and y1 <= y2, and at most a string `label`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from vlmgym.envs.rec.boxes import SCALE, Box, ordered

MAX_ANSWER_CHARS = 20_000  # an answer of a few hundred tokens is far shorter; junk beyond this is not read
MAX_BOXES_COUNTED = 100
_NUMBER = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
# Each number is bounded by the brackets and commas around it, so a failed match backtracks over one number only.
BOX_PATTERN = re.compile(rf"\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]")
ALLOWED_KEYS = {"bbox_2d", "label"}
THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedAnswer:
    """What an answer holds: the scored box (0-1000, clipped, corners in order; None: no box), how many boxes it
    lists, and whether it is exactly in Qwen3-VL's form."""

    box: Box | None
    n_boxes: int
    format_ok: bool


def read_boxes(text: str) -> tuple[Box | None, int]:
    """(the first box, clipped to 0-1000 with its corners in order, or None; the number of boxes, capped)."""
    first: Box | None = None
    count = 0
    for match in BOX_PATTERN.finditer(THINK.sub(" ", text[:MAX_ANSWER_CHARS])):
        values = [float(token) for token in match.groups()]  # float literals only: a huge one is inf, no error
        if not all(map(math.isfinite, values)):
            continue
        if first is None:
            first = ordered(tuple(min(float(SCALE), max(0.0, v)) for v in values))  # type: ignore[arg-type]
        count += 1
        if count >= MAX_BOXES_COUNTED:
            break
    return first, count


def _strip_fence(text: str) -> str | None:
    body = text.strip()
    if not body.startswith("```"):
        return body
    body = body[3:]
    if body.startswith("json"):
        body = body[4:]
    return body[:-3] if body.endswith("```") else None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a coordinate")


def is_canonical(text: str) -> bool:
    """Whether the answer is exactly `[{"bbox_2d": [x1, y1, x2, y2], "label": "..."}]` (see the module docstring)."""
    if len(text) > MAX_ANSWER_CHARS:
        return False
    body = _strip_fence(text)
    if body is None:
        return False
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
        return False
    if not (isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict)):
        return False
    item = value[0]
    if "bbox_2d" not in item or not set(item) <= ALLOWED_KEYS or not isinstance(item.get("label", ""), str):
        return False
    box = item["bbox_2d"]
    if not (isinstance(box, list) and len(box) == 4
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= SCALE for v in box)):
        return False
    return box[0] <= box[2] and box[1] <= box[3]


def parse_answer(text: str) -> ParsedAnswer:
    """The box, box count and format flag of an answer (anything not a string reads as empty); never raises."""
    text = text if isinstance(text, str) else ""
    box, count = read_boxes(text)
    return ParsedAnswer(box, count, count == 1 and is_canonical(text))
