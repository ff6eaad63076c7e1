"""Boxes in Qwen3-VL's grounding convention, and the one place that converts them to and from pixels.

Qwen3-VL grounds an expression as JSON, `[{"bbox_2d": [x1, y1, x2, y2], "label": "small red circle"}]`, with
coordinates relative to the image: integers from 0 (the left or top edge) to 1000 (the right or bottom edge),
whatever the image's size. (x1, y1) is the top-left corner and (x2, y2) the bottom-right, y growing downwards.
Qwen2.5-VL used absolute pixels of the image as its processor resized it instead; Qwen3-VL's relative scale does
not depend on that resizing, nor on the shard stage's.

Pixel boxes are (x1, y1, x2, y2) in continuous pixel coordinates: the image spans [0, width] x [0, height], so a
box's edges lie between pixels and a COCO box [x, y, w, h] is (x, y, x + w, y + h) (xywh_to_xyxy).

pixels_to_qwen rounds each coordinate to the nearest unit (half up) and clips it to 0-1000, so a round trip through
pixels moves an edge by at most half a unit, width / 2000 pixels; qwen_to_pixels is exact, so qwen -> pixels ->
qwen gives the same integers back. IoU does not change when x and y are scaled, each by its own factor, so an IoU
in 0-1000 units is the IoU in pixels of the image at any size: the truth is stored in 0-1000 units.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

SCALE = 1000  # Qwen3-VL's relative coordinates run 0..SCALE

Box = tuple[float, float, float, float]


def _size(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"image {what} must be a positive finite number, got {value!r}")
    return float(value)


def _coordinates(box: Sequence[float]) -> Box:
    values = tuple(box)
    if len(values) != 4 or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                                   for v in values):
        raise ValueError(f"a box is four finite numbers (x1, y1, x2, y2), got {box!r}")
    return values  # type: ignore[return-value]


def _unit(value: float, size: float) -> int:
    return int(min(SCALE, max(0, math.floor(SCALE * value / size + 0.5))))


def pixels_to_qwen(box: Sequence[float], width: float, height: float) -> tuple[int, int, int, int]:
    """A pixel box (x1, y1, x2, y2) of a width x height image in Qwen3-VL's 0-1000 integers (rounded, clipped)."""
    width, height = _size(width, "width"), _size(height, "height")
    x1, y1, x2, y2 = _coordinates(box)
    return _unit(x1, width), _unit(y1, height), _unit(x2, width), _unit(y2, height)


def qwen_to_pixels(box: Sequence[float], width: float, height: float) -> Box:
    """A 0-1000 box as pixels (floats) of a width x height image."""
    width, height = _size(width, "width"), _size(height, "height")
    x1, y1, x2, y2 = _coordinates(box)
    return x1 * width / SCALE, y1 * height / SCALE, x2 * width / SCALE, y2 * height / SCALE


def xywh_to_xyxy(box: Sequence[float]) -> Box:
    """A COCO box [x, y, w, h] (top-left corner, width, height) as corners (x1, y1, x2, y2)."""
    x, y, w, h = _coordinates(box)
    return x, y, x + w, y + h


def ordered(box: Sequence[float]) -> Box:
    """The same rectangle with x1 <= x2 and y1 <= y2 (swapped corners put back)."""
    x1, y1, x2, y2 = box
    return min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2)


def area(box: Sequence[float]) -> float:
    """Area of an ordered box (0 for a degenerate or inverted one)."""
    x1, y1, x2, y2 = box
    return max(0.0, x2 - x1) * max(0.0, y2 - y1)


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ordered boxes, in [0, 1]; 0 when either has no area (or is not finite)."""
    area_a, area_b = area(a), area(b)
    if not (area_a > 0 and area_b > 0 and math.isfinite(area_a) and math.isfinite(area_b)):
        return 0.0
    inter = area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))
    return min(1.0, max(0.0, inter / (area_a + area_b - inter)))


def answer_json(box: Sequence[int], label: str, label_first: bool = False) -> str:
    """The canonical answer: `[{"bbox_2d": [x1, y1, x2, y2], "label": label}]` with 0-1000 integers (with
    label_first, the same object with the label first)."""
    box = [int(v) for v in box]
    item = {"label": label, "bbox_2d": box} if label_first else {"bbox_2d": box, "label": label}
    return json.dumps([item], ensure_ascii=False)
