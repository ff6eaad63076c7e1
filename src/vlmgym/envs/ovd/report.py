"""ovd's part of reports/eval.html: the gallery's images with every true box (black) and each policy's predicted
boxes drawn on them (rec's drawing and colours), and the legend."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from PIL import Image, ImageDraw

from vlmgym.envs.rec import report as rec_report


def gallery_image(image: Image.Image, records: Mapping[str, Mapping[str, Any] | None]) -> Image.Image:
    """The true boxes and each policy's predicted boxes drawn at the gallery's thumbnail size."""
    colours = rec_report.policy_colours(list(records))
    present = {policy: record for policy, record in records.items() if record is not None}
    truth = next((r.get("truth") for r in present.values() if isinstance(r.get("truth"), Mapping)), {}) or {}
    canvas = rec_report.draw_boxes(image, None, [], max_px=rec_report.GALLERY_PX)
    draw = ImageDraw.Draw(canvas)
    for item in truth.get("boxes") or []:
        rec_report._rectangle(draw, item["bbox_2d"], canvas.size, rec_report.TRUTH_COLOUR, rec_report.TRUTH_WIDTH)
    for policy, record in present.items():
        for _, box in record.get("pred_boxes") or []:
            rec_report._rectangle(draw, box, canvas.size, colours[policy], rec_report.PREDICTION_WIDTH)
    return canvas


def legend_html(policies: Sequence[str]) -> str:
    """The paragraph above the gallery that says which box is which."""
    legend = ", ".join(f'<span style="color:{c}">{html.escape(p)}</span>'
                       for p, c in rec_report.policy_colours(policies).items())
    return ("<h2>Detections</h2><p>Each gallery image below shows every true box of a named category (thick, black) "
            f"and each policy's predicted boxes (thin: {legend}).</p>")
