"""colour: name the colour of a noisy plain image. A complete vlmgym plug-in that lives outside the package.

docs/writing-an-env.md shows this file; tests run it through the whole pipeline with
`env.name: colour_env:ColourEnv` (tests/pipeline/test_external_env.py).
"""

from __future__ import annotations

import html
import io
from collections import Counter
from dataclasses import dataclass

import numpy as np
from PIL import Image

from vlmgym.api import SAFE_KEY, Env, Row, RowSchema, RowSkip, Statistic, layout, spec

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 60, 220), "yellow": (230, 210, 40)}
PROMPT = "What colour is this image? Answer with one word."


@dataclass(frozen=True)
class ColourParams:
    """colour reward: 1 for the right word, plus a share for answering with one colour word at all."""

    format_weight: float = spec(0.1, ge=0, le=1, doc="share of the reward for a one-word colour answer")


@dataclass(frozen=True)
class ColourData:
    """colour generator: plain images with pixel noise."""

    noise: float = spec(20.0, ge=0, le=100, doc="std-dev of the pixel noise")


def parse_row(rec: dict[str, str]) -> Row:
    """One CSV row (id, colour) as a sample with the image {id}.png; anything else is a counted skip."""
    if not SAFE_KEY.match(rec["id"]):
        raise RowSkip("bad_id", f"id {rec['id']!r} is not a plain token")
    if rec["colour"] not in COLOURS:
        raise RowSkip("bad_colour", f"colour {rec['colour']!r} is not one of {sorted(COLOURS)}")
    return Row(rec["id"], (f"{rec['id']}.png",), {"colour": rec["colour"]})


class ColourEnv(Env):
    """Name the colour of a plain image."""

    name = "colour"
    schema = RowSchema("colour", ("id", "colour"), ("jpg",), parse_row)
    Params = ColourParams  # optional, like everything below but prompt, score, ideal_answer and write_synthetic
    DataParams = ColourData
    metric_rows = {"accuracy": ("accuracy", "rate")}

    # --- interaction ---
    def prompt(self, sample):
        return PROMPT

    def score(self, state, text):
        said = (text or "").strip().rstrip(".").lower()
        correct = said == state.meta["colour"]
        one_word = said in COLOURS
        weight = self.params.format_weight
        reward = (1 - weight) * correct + weight * one_word
        return reward, {"parsed": {"said": said}, "correct": correct, "format_ok": one_word,
                        "reward_components": {"correct": float(correct), "format": float(one_word)}}

    def ideal_answer(self, meta):
        return meta["colour"]

    # optional: which colour each image shows, for sft.perception's warm-up of the vision tower
    perception_heads = (len(COLOURS),)

    def perception_labels(self, meta):
        return [sorted(COLOURS).index(meta["colour"])]

    @classmethod
    def corpus(cls):
        return [PROMPT, *COLOURS, *(c.capitalize() for c in COLOURS)]

    # --- data: the raw layout (a CSV and a zip of images per split) ---
    @classmethod
    def write_synthetic(cls, data, out_dir):
        noise = cls.data_settings(data).noise
        for split, count in (("train", data.train_images), ("test", data.test_images)):
            rng = np.random.default_rng([data.seed, 0 if split == "train" else 1])
            rows, members = [], []
            for i in range(count):
                colour = sorted(COLOURS)[int(rng.integers(len(COLOURS)))]
                pixels = np.asarray(COLOURS[colour], float) + rng.normal(0, noise, (data.image_height,
                                                                                   data.image_width, 3))
                buffer = io.BytesIO()
                Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, format="PNG")
                rows.append([f"{split}{i:05d}", colour])
                members.append((f"{split}{i:05d}.png", buffer.getvalue()))
            layout.write_csv(layout.csv_path(out_dir, split), ["id", "colour"], rows)
            layout.write_zip(layout.zip_dir(out_dir, split) / layout.zip_name(0), members)
        return {"colours": sorted(COLOURS)}

    # --- evaluation: a rollout record holds info["parsed"] and the sample's meta as "truth" ---
    @classmethod
    def task_statistics(cls, records, **options):
        correct = [r["parsed"]["said"] == r["truth"]["colour"] for r in records]
        return {"accuracy": Statistic("mean", np.asarray(correct, np.float64))}

    @classmethod
    def truth_text(cls, truth):
        return truth["colour"]

    @classmethod
    def outcome_text(cls, record):
        return "right colour" if record["parsed"]["said"] == record["truth"]["colour"] else "wrong colour"

    @classmethod
    def report_html(cls, records_by_policy, params):
        rows = ""
        for policy, records in records_by_policy.items():
            confusions = Counter((r["truth"]["colour"], r["parsed"]["said"] or "(nothing)") for r in records)
            rows += "".join(f"<tr><td>{html.escape(policy)}</td><td>{colour}</td><td>{html.escape(said)}</td>"
                            f"<td>{n}</td></tr>" for (colour, said), n in sorted(confusions.items()))
        return ("<h2>Colour confusions</h2><table><tr><th>policy</th><th>truth</th><th>said</th><th>answers</th>"
                f"</tr>{rows}</table>")
