"""rec's part of reports/eval.html: the gallery's images with the true box (black) and each policy's predicted box
drawn on them, and the legend that says which colour is which policy."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from PIL import Image, ImageDraw

from vlmgym.envs.rec.boxes import qwen_to_pixels
from vlmgym.stats.plots import POLICY_COLOURS

# Black: no shape is black and the backgrounds are light, so the truth never blends into what it frames.
TRUTH_COLOUR = "#000000"
# The report's policy colours, in page order like its plots (the shapes' own colours are close to some of them,
# but a thin outline still reads as a box).
PREDICTION_COLOURS = POLICY_COLOURS
# The gallery's thumbnail size (vlmgym.eval.report.THUMBNAIL_PX, which tests/envs/test_rec.py keeps equal): drawing
# at it keeps the lines sharp. Not imported: the eval report module is no dependency of the stages that build envs.
GALLERY_PX = 192
DISPLAY_PX = 320  # the longer side of a drawn image: the 256x192 scenes are scaled up, COCO photos down
TRUTH_WIDTH, PREDICTION_WIDTH = 4, 2


def _rectangle(draw: ImageDraw.ImageDraw, box: Sequence[float], size: tuple[int, int], colour: str,
               width: int) -> None:
    x1, y1, x2, y2 = qwen_to_pixels(box, *size)
    # PIL's corners are inclusive pixel indices; a box's edges lie between pixels
    draw.rectangle((x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)), outline=colour, width=width)


def draw_boxes(image: Image.Image, truth: Sequence[float] | None,
               predictions: Sequence[tuple[Sequence[float] | None, str]], max_px: int = DISPLAY_PX) -> Image.Image:
    """A copy of `image` scaled to `max_px` on its longer side, with the true box (0-1000 units, black, thick) and
    each (predicted box or None, colour) drawn over it."""
    scale = max_px / max(image.size)
    canvas = image.convert("RGB").resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                                         Image.BICUBIC)
    draw = ImageDraw.Draw(canvas)
    if truth is not None:
        _rectangle(draw, truth, canvas.size, TRUTH_COLOUR, TRUTH_WIDTH)
    for box, colour in predictions:  # over the truth: a perfect prediction shows as a line inside the black
        if box is not None:
            _rectangle(draw, box, canvas.size, colour, PREDICTION_WIDTH)
    return canvas


def policy_colours(policies: Sequence[str]) -> dict[str, str]:
    """Each policy's box colour, by its place in the page's policy order."""
    return {policy: PREDICTION_COLOURS[i % len(PREDICTION_COLOURS)] for i, policy in enumerate(policies)}


def gallery_image(image: Image.Image, records: Mapping[str, Mapping[str, Any] | None]) -> Image.Image:
    """A gallery card's image: the true box and each policy's predicted box drawn at the thumbnail's size (so the
    lines stay sharp), the truth read from whichever record there is."""
    colours = policy_colours(list(records))
    present = {policy: record for policy, record in records.items() if record is not None}
    truth = next((r.get("truth") for r in present.values() if isinstance(r.get("truth"), Mapping)), {}) or {}
    return draw_boxes(image, truth.get("bbox_2d"), [(r.get("pred_box"), colours[p]) for p, r in present.items()],
                      max_px=GALLERY_PX)


def legend_html(policies: Sequence[str]) -> str:
    """The paragraph above the gallery that says which box is which."""
    legend = ", ".join(f'<span style="color:{c}">{html.escape(p)}</span>' for p, c in policy_colours(policies).items())
    return (f'<h2>Boxes</h2><p>Each gallery image below shows the true box (thick, <span style="color:{TRUTH_COLOUR}">'
            f"black</span>) and each policy's predicted box (thin: {legend}); an answer without a box draws none.</p>")
