"""message_decoding's decoder image: the coded -> plain table of all 26 letters, drawn as a grid of cells.

Each cell holds a coded letter (top, on a shaded band) over the plain letter it decodes to (bottom). Cells are laid
out BLOCKS rows of COLUMNS (3 x 9 = 27 places for 26 letters, the last left blank), in the order given: alphabetical
for train and test, shuffled for test_ood under `data.message_decoding.ood_shift: shuffled`. 3 x 9 rather than
2 x 13 gives each letter the most room at the pipeline's 4:3 image size: at 256x192 a cell is about 28x32 pixels and
a letter about 20 pixels tall, still a few pixels at the tiny model's downscaled 128x96.
"""

from __future__ import annotations

import functools

from PIL import Image, ImageDraw, ImageFont

COLUMNS = 9
BLOCKS = 3
MARGIN = 0.04  # of each side, blank around the table
PAPER = (250, 250, 246)
BAND = (212, 222, 238)  # the coded letters' band
INK = (20, 20, 30)
RULE = (90, 90, 110)


@functools.cache
def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    # Pillow's bundled font (no file, no network); scalable when Pillow has FreeType (>= 10.1)
    return ImageFont.load_default(size=size)


def render_table(decoder: str, columns: str, width: int, height: int, drawn: str = "") -> Image.Image:
    """The RGB table image: `columns` lists the coded letters in drawing order, `decoder[i]` is the plain letter of
    coded letter chr(ord('a') + i); with `drawn`, only those coded letters' cells hold letters (empty: all)."""
    image = Image.new("RGB", (width, height), PAPER)
    draw = ImageDraw.Draw(image)
    left, top = width * MARGIN, height * MARGIN
    cell_w = (width - 2 * left) / COLUMNS
    cell_h = (height - 2 * top) / BLOCKS
    half = cell_h / 2
    font = _font(max(6, int(min(cell_w * 0.8, half * 0.8))))
    line = max(1, round(min(width, height) / 200))
    for place, coded in enumerate(columns):
        row, col = divmod(place, COLUMNS)
        x0, y0 = left + col * cell_w, top + row * cell_h
        draw.rectangle((x0, y0, x0 + cell_w, y0 + half), fill=BAND)
        draw.rectangle((x0, y0, x0 + cell_w, y0 + cell_h), outline=RULE, width=line)
        draw.line((x0, y0 + half, x0 + cell_w, y0 + half), fill=RULE, width=line)
        if drawn and coded not in drawn:
            continue
        plain = decoder[ord(coded) - ord("a")]
        draw.text((x0 + cell_w / 2, y0 + half / 2), coded, font=font, fill=INK, anchor="mm")
        draw.text((x0 + cell_w / 2, y0 + half * 1.5), plain, font=font, fill=INK, anchor="mm")
    return image


def place_at(x: float, y: float) -> int | None:
    """The drawing place (row * COLUMNS + column) of the cell under (x, y), given as fractions of the image's width
    and height; None on the margin."""
    column = int((x - MARGIN) / (1 - 2 * MARGIN) * COLUMNS) if x >= MARGIN else -1
    row = int((y - MARGIN) / (1 - 2 * MARGIN) * BLOCKS) if y >= MARGIN else -1
    return row * COLUMNS + column if 0 <= column < COLUMNS and 0 <= row < BLOCKS else None
