"""rec's part of reports/eval.html: a few test images with the true box (green) and each policy's predicted box,
drawn here and embedded as PNG data URIs (the page stays self-contained)."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from vlmgym.envs.rec.boxes import qwen_to_pixels
from vlmgym.eval.plots import POLICY_COLOURS

TRUTH_COLOUR = "#00b400"
# The policies' colours, less the palette's green, which would read as the truth.
PREDICTION_COLOURS = tuple(c for c in POLICY_COLOURS if c != "#2ca02c")
DISPLAY_PX = 320  # the longer side of a drawn image: the 256x192 scenes are scaled up, COCO photos down
TRUTH_WIDTH, PREDICTION_WIDTH = 4, 2


def _rectangle(draw: ImageDraw.ImageDraw, box: Sequence[float], size: tuple[int, int], colour: str,
               width: int) -> None:
    x1, y1, x2, y2 = qwen_to_pixels(box, *size)
    # PIL's corners are inclusive pixel indices; a box's edges lie between pixels
    draw.rectangle((x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)), outline=colour, width=width)


def draw_boxes(image: Image.Image, truth: Sequence[float] | None,
               predictions: Sequence[tuple[Sequence[float] | None, str]], max_px: int = DISPLAY_PX) -> Image.Image:
    """A copy of `image` scaled to `max_px` on its longer side, with the true box (0-1000 units, green, thick) and
    each (predicted box or None, colour) drawn over it."""
    scale = max_px / max(image.size)
    canvas = image.convert("RGB").resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                                         Image.BICUBIC)
    draw = ImageDraw.Draw(canvas)
    if truth is not None:
        _rectangle(draw, truth, canvas.size, TRUTH_COLOUR, TRUTH_WIDTH)
    for box, colour in predictions:  # over the truth: a perfect prediction shows as a line inside the green
        if box is not None:
            _rectangle(draw, box, canvas.size, colour, PREDICTION_WIDTH)
    return canvas


def png_data_uri(image: Image.Image) -> str:
    """The image as a PNG data URI."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def load_images(split_dir: str | Path, ids: set[str]) -> dict[str, Image.Image]:
    """{id: image} of the samples `ids` in a shard split folder (e.g. data/shards/test); {} when it is missing."""
    from vlmgym.data.shards import read_split

    folder = Path(split_dir)
    try:
        samples = read_split(folder.parent, folder.name, image_exts=("jpg",))
    except FileNotFoundError:
        return {}
    return {s.key: s.images[0] for s in samples if s.key in ids and s.images}


def box_section_html(records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], count: int,
                     split_dir: str | Path) -> str:
    """The section: the first `count` samples (by id) drawn with their boxes, one card each."""
    ids = sorted({str(r["id"]) for records in records_by_policy.values() for r in records})[:count]
    if not ids:
        return ""
    images = load_images(split_dir, set(ids))
    colours = {policy: PREDICTION_COLOURS[i % len(PREDICTION_COLOURS)] for i, policy in enumerate(records_by_policy)}
    legend = ", ".join(f'<span style="color:{c}">{html.escape(p)}</span>' for p, c in colours.items())
    parts = ['<h2>Boxes on test images</h2><p>Thick <span style="color:' + TRUTH_COLOUR + '">green</span>: the true '
             f"box; thin: each policy's predicted box ({legend}); an answer without a box draws none.</p>"]
    missing = [i for i in ids if i not in images]
    if missing:
        parts.append(f"<p>{len(missing)} of these samples have no image in {html.escape(str(split_dir))} "
                     "(env.rec.report_images names the shard split the policies answered).</p>")
    cards = []
    by_policy = {p: {str(r["id"]): r for r in records} for p, records in records_by_policy.items()}
    for sample_id in ids:
        if sample_id not in images:
            continue
        records = {p: recs[sample_id] for p, recs in by_policy.items() if sample_id in recs}
        truth = next(iter(records.values())).get("truth") or {}
        drawn = draw_boxes(images[sample_id], truth.get("bbox_2d"),
                           [(r.get("pred_box"), colours[p]) for p, r in records.items()])
        lines = "".join(f'<div><span style="color:{colours[p]}">&#9632;</span> {html.escape(p)}: '
                        f"{html.escape(_iou_text(r))}</div>" for p, r in records.items())
        cards.append(f'<div class="card rec-boxes"><img src="{png_data_uri(drawn)}" alt="boxes of sample '
                     f'{html.escape(sample_id)}"><div><b>id</b> {html.escape(sample_id)}</div>'
                     f"<div><b>expression</b> {html.escape(str(truth.get('expression', '')))}</div>{lines}</div>")
    parts.append('<div class="gallery">' + "".join(cards) + "</div>")
    return "".join(parts)


def _iou_text(record: Mapping[str, Any]) -> str:
    iou = (record.get("parsed") or {}).get("iou")
    if record.get("pred_box") is None:
        return "no box"
    return f"IoU {iou:.2f}" if isinstance(iou, float | int) else "box"
