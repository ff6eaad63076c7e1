"""Small user data sets for the user_data env's tests, written into a folder: tiny PNG and JPEG images, a VLM-R1
jsonl (EXAMPLE_LINES, the lines docs/envs/user_data.md shows, then generated ones and BAD_LINES), and the same
questions as a `datasets` DatasetDict saved with save_to_disk (and as parquet files)."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

from PIL import Image, ImageDraw

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 60, 220), "yellow": (230, 210, 40)}
SIZE = (64, 48)
SIDE = 16

# The lines docs/envs/user_data.md shows (tests/envs/test_user_data.py checks the page holds them)
EXAMPLE_LINES = [
    {"id": "colour-1", "image": "red-0.png",
     "conversations": [{"from": "human", "value": "<image>What colour is the square? Answer with one word."},
                       {"from": "gpt", "value": "red"}]},
    {"id": "pair-1", "image": ["red-0.png", "blue-1.jpg"],
     "conversations": [{"from": "human",
                        "value": "<image><image>Are both squares the same colour? A. yes B. no. Answer with the "
                                 "letter."},
                       {"from": "gpt", "value": "B"}]},
    {"id": "box-1", "image": "blue-1.jpg",
     "conversations": [{"from": "human", "value": "<image>Where is the square? Answer [x1, y1, x2, y2], 0-1000 "
                                                  "relative to the image."},
                       {"from": "gpt", "value": "[250, 333, 500, 667]"}]},
]
# Lines every reader skips, one per reason (the shard manifest and the download stats count them)
BAD_LINES = [
    '{"id": "no-file", "image": "absent.png", "conversations": [{"from": "human", "value": "<image>Colour?"}, '
    '{"from": "gpt", "value": "red"}]}',
    '{"id": "broken", "image": "broken.png", "conversations": [{"from": "human", "value": "<image>Colour?"}, '
    '{"from": "gpt", "value": "red"}]}',
    '{"id": "no-answer", "image": "red-0.png", "conversations": [{"from": "human", "value": "<image>Colour?"}]}',
    '{"id": "cut", "image": "red-0.png", "conversa',
    '{"id": "number-image", "image": 5, "conversations": [{"from": "human", "value": "<image>Colour?"}, '
    '{"from": "gpt", "value": "red"}]}',
]
BAD_REASONS = {"image_missing": 1, "image_unreadable": 1, "missing_answer": 1, "bad_json": 1, "bad_types": 1}


def draw(colour: str, x: int, y: int) -> Image.Image:
    image = Image.new("RGB", SIZE, (128, 128, 128))
    ImageDraw.Draw(image).rectangle((x, y, x + SIDE - 1, y + SIDE - 1), fill=COLOURS[colour])
    return image


def box_text(x: int, y: int) -> str:
    return "[{}, {}, {}, {}]".format(*(round(1000 * v / s) for v, s in zip((x, y, x + SIDE, y + SIDE), SIZE * 2)))


def image_set(folder: Path, count: int = 12) -> dict[str, tuple[str, int, int]]:
    """`count` images, PNG and JPEG in turn, named <colour>-<i>.<ext>: {name: (colour, x, y)}; and broken.png."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    made = {}
    for i in range(count):
        colour = sorted(COLOURS)[i % len(COLOURS)] if i > 1 else ("red", "blue")[i]
        x, y = (16, 16) if i < 2 else (rng.randrange(SIZE[0] - SIDE), rng.randrange(SIZE[1] - SIDE))
        name = f"{colour}-{i}.{'png' if i % 2 == 0 else 'jpg'}"
        draw(colour, x, y).save(folder / name)
        made[name] = (colour, x, y)
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    return made


def questions(images: dict[str, tuple[str, int, int]], rows: int) -> list[dict]:
    """EXAMPLE_LINES, then generated lines: a colour word, a box, and a two-image letter question in turn."""
    names = sorted(images)
    lines = [dict(line) for line in EXAMPLE_LINES]
    for i in range(rows - len(lines)):
        first, second = names[i % len(names)], names[(3 * i + 1) % len(names)]
        colour, x, y = images[first]
        kind = i % 3
        if kind == 0:
            human, gpt, image = "<image>What colour is the square? Answer with one word.", colour, first
        elif kind == 1:
            human, gpt, image = EXAMPLE_LINES[2]["conversations"][0]["value"], box_text(x, y), first
        else:
            human = EXAMPLE_LINES[1]["conversations"][0]["value"]
            gpt, image = ("A" if images[second][0] == colour else "B"), [first, second]
        lines.append({"id": f"q{i:03d}", "image": image, "source": "generated",
                      "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]})
    return lines


def write_jsonl(folder: Path, rows: int = 40, bad: bool = True) -> Path:
    """folder/images/ and folder/vqa.jsonl: `rows` good lines (then BAD_LINES when `bad`); returns the jsonl."""
    images = image_set(folder / "images")
    path = folder / "vqa.jsonl"
    text = "".join(json.dumps(line) + "\n" for line in questions(images, rows))
    path.write_text(text + ("".join(line + "\n" for line in BAD_LINES) if bad else ""))
    return path


def table_rows(folder: Path, rows: int = 40) -> list[dict]:
    """The one-image questions of `questions` as table rows (image bytes, question, answer, source)."""
    images = image_set(folder / "images")
    out = []
    for line in questions(images, rows):
        if isinstance(line["image"], list):
            continue
        data = (folder / "images" / line["image"]).read_bytes()
        out.append({"id": line["id"], "image": {"bytes": data, "path": None},
                    "question": line["conversations"][0]["value"].replace("<image>", ""),
                    "answer": line["conversations"][1]["value"], "source": line.get("source", "example")})
    return out


def write_dataset(folder: Path, rows: int = 40, test_every: int = 4) -> Path:
    """folder/vqa_dataset: a DatasetDict (train, test: every `test_every`-th row) saved with save_to_disk, plus a row
    without an answer in train; returns its folder."""
    import datasets

    features = datasets.Features({"id": datasets.Value("string"), "image": datasets.Image(),
                                  "question": datasets.Value("string"), "answer": datasets.Value("string"),
                                  "source": datasets.Value("string")})
    table = table_rows(folder, rows)
    train = [r for i, r in enumerate(table) if i % test_every]
    train.append({**train[0], "id": "no-answer", "answer": None})
    test = [r for i, r in enumerate(table) if not i % test_every]

    def dataset(items: list[dict]) -> datasets.Dataset:
        return datasets.Dataset.from_list(items, features=features)

    path = folder / "vqa_dataset"
    datasets.DatasetDict({"train": dataset(train), "test": dataset(test)}).save_to_disk(str(path))
    return path


def png_bytes(colour: str = "red") -> bytes:
    buffer = io.BytesIO()
    draw(colour, 8, 8).save(buffer, "PNG")
    return buffer.getvalue()
