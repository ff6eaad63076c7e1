"""A multi-turn episode in a gallery card of reports/eval.html: each turn's text, and for each zoom the source image
with the region it showed drawn on it (vlmgym.envs.multiturn; records from vlmgym.eval.rollouts.answer_episodes)."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import Any

from PIL import Image, ImageDraw

BOX_COLOUR = (230, 60, 20)
TURN_CHARS = 200  # a turn's text is cut here in the card (the rollout JSONL keeps it whole)


def zoom_image(image: Image.Image, box: list[float]) -> Image.Image:
    """`image` with a 0-1000 box drawn on it."""
    out = image.convert("RGB")
    width, height = out.size
    x1, y1, x2, y2 = (float(v) for v in box)
    line = max(1, round(min(width, height) / 64))
    ImageDraw.Draw(out).rectangle((x1 / 1000 * width, y1 / 1000 * height, x2 / 1000 * width, y2 / 1000 * height),
                                  outline=BOX_COLOUR, width=line)
    return out


def episode_html(record: Mapping[str, Any], image: Image.Image | None,
                 thumbnail: Callable[[Image.Image], str]) -> str:
    """The turns of a record's episode (empty for a one-turn answer): each call's text and outcome, with its zoom
    box drawn on the sample's first image when there is one."""
    turns = record.get("turns")
    if not isinstance(turns, list) or len(turns) < 2:
        return ""
    calls = [c for c in record.get("tool_calls") or [] if isinstance(c, Mapping)]
    rows = []
    for number, text in enumerate(turns[:-1]):
        call = calls[number] if number < len(calls) else {}
        text = str(text)
        shown = text if len(text) <= TURN_CHARS else text[:TURN_CHARS] + " ..."
        outcome = "ran" if call.get("ok") else f"refused: {call.get('error')}"
        row = f'<div class="note">turn {number + 1}: {html.escape(outcome)}</div><pre>{html.escape(shown)}</pre>'
        box = call.get("box")
        if call.get("ok") and image is not None and isinstance(box, list) and len(box) == 4:
            row += f'<img src="{thumbnail(zoom_image(image, box))}" alt="zoom of turn {number + 1}">'
        rows.append(row)
    return f'<div class="episode">{"".join(rows)}<div class="note">turn {len(turns)}: the answer</div></div>'
