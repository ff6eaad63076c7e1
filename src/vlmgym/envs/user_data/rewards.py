"""user_data's named rewards: each scores one answer against the truth in [0, 1] and never raises.

Every reward first passes the answer through the junk gate (`is_junk`): an answer that is empty, longer than the
limit, holds a NUL or an unpaired surrogate, holds a think/answer tag (the think option unwraps the answer block
before the env sees it), or has no letter or digit at all (emoji, punctuation) gets 0 from every reward, the
user's TRL-style functions included (they are not called for it).

The truth's kind (`kind_of`) decides what an answer must look like:
- box: `[x1, y1, x2, y2]`, four finite numbers in brackets (any scale: the same units as the data's answers);
- number: one number (`-3`, `2.5`, `1e3`);
- choice: one letter A-Z, alone or as `(B)`, `B.`, `B)` or `B:`;
- text: anything else.

The named rewards:
- `exact`: the normalised answer equals the normalised truth (NFKC, case-folded, whitespace collapsed, a trailing
  `.` or `!` and markdown emphasis or quotes around the whole dropped);
- `numeric`: the answer is one number (an optional "answer:"-like lead aside) within `numeric_tolerance` (absolute)
  or `numeric_relative_tolerance` (of the truth) of the true number;
- `choice`: the answer is one letter (forms above, case-insensitive) and it is the true letter;
- `iou`: the IoU of the answer's first box with the true box (`iou_threshold` > 0: 1 at or above it, else 0);
  uses rec's box pattern and IoU (vlmgym.envs.rec);
- `accuracy`: by the truth's kind: `iou` for a box, `numeric` for a number, `choice` for a letter, `exact` else;
- `format`: the whole answer has the truth's kind's form (one box alone, one number alone, one letter alone; for
  text, one line of at most `max(4, 2 x the truth's words)` words). It pays a wrong answer of the right form, as
  a format reward does: give it a small weight.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from vlmgym.envs.rec.boxes import iou, ordered
from vlmgym.envs.rec.parse import BOX_PATTERN

KINDS = ("box", "number", "choice", "text")
NAMED = ("accuracy", "exact", "numeric", "choice", "iou", "format")
TAG = re.compile(r"</?\s*(?:think|answer)\s*>", re.IGNORECASE)
_NUMBER = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
NUMBER = re.compile(_NUMBER)
CHOICE = re.compile(r"\(?([A-Za-z])\s*[).:]?")
# "Answer: 7", "The answer is 7": a lead that says nothing, read past by numeric and choice (not by format)
LEAD = re.compile(r"(?:(?:the\s+)?(?:final\s+)?answer\s*(?:is\s*)?[:=]?\s*)", re.IGNORECASE)
_DECORATION = "*_`\"'"


@dataclass(frozen=True)
class Settings:
    """What the rewards read of env.user_data (env.py's UserDataParams holds these fields, and more)."""

    max_answer_chars: int = 2000
    numeric_tolerance: float = 0.0
    numeric_relative_tolerance: float = 0.0
    iou_threshold: float = 0.0


def is_junk(text: object, max_chars: int = 2000) -> bool:
    """Whether an answer earns nothing from any reward (module docstring)."""
    if not isinstance(text, str):
        return True
    body = text.strip()
    if not body or len(text) > max_chars or "\x00" in body or TAG.search(body):
        return True
    try:
        body.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return True
    return not any(unicodedata.category(c)[0] in "LN" for c in body)


def normalise(text: str) -> str:
    """The comparable form of an answer or a truth (see `exact`)."""
    text = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    while text and text[-1] in ".!":
        text = text[:-1].rstrip()
    while len(text) >= 2 and text[0] == text[-1] and text[0] in _DECORATION:
        text = text[1:-1].strip()
    return text


def _ascii(text: str) -> bool:
    return text.isascii()


def read_number(text: str, lead: bool = True) -> float | None:
    """The one finite number `text` is (after a lead when `lead`, with a trailing `.`), else None."""
    body = text.strip().rstrip(".").strip()
    if lead:
        body = LEAD.sub("", body, count=1) if LEAD.match(body) else body
    if not _ascii(body) or NUMBER.fullmatch(body) is None:
        return None
    value = float(body)
    return value if math.isfinite(value) else None


def read_choice(text: str, lead: bool = True) -> str | None:
    """The one letter `text` is (forms in the module docstring), upper-cased, else None."""
    body = text.strip()
    if lead:
        body = LEAD.sub("", body, count=1) if LEAD.match(body) else body
    match = CHOICE.fullmatch(body.strip())
    if match is None or not _ascii(body) or (body.startswith("(") and ")" not in body):
        return None
    return match.group(1).upper()


def read_boxes(text: str) -> list[tuple[float, float, float, float]]:
    """Every finite `[x1, y1, x2, y2]` in `text` (rec's BOX_PATTERN), corners ordered, unclipped."""
    boxes = []
    for match in BOX_PATTERN.finditer(text):
        values = tuple(float(v) for v in match.groups())
        if all(map(math.isfinite, values)):
            boxes.append(ordered(values))
        if len(boxes) >= 100:
            break
    return boxes


def kind_of(truth: str) -> str:
    """The kind of a truth (module docstring): box, number, choice or text."""
    body = truth.strip()
    boxes = read_boxes(body)
    if len(boxes) == 1 and BOX_PATTERN.fullmatch(body):
        return "box"
    if read_number(body, lead=False) is not None:
        return "number"
    if read_choice(body, lead=False) is not None and len(body) <= 4:
        return "choice"
    return "text"


def exact(answer: str, truth: str, settings: Settings) -> float:
    return float(normalise(answer) == normalise(truth) != "")


def numeric(answer: str, truth: str, settings: Settings) -> float:
    said, true = read_number(answer), read_number(truth, lead=False)
    if said is None or true is None:
        return 0.0
    allowed = max(settings.numeric_tolerance, settings.numeric_relative_tolerance * abs(true))
    return float(abs(said - true) <= allowed)


def choice(answer: str, truth: str, settings: Settings) -> float:
    said, true = read_choice(answer), read_choice(truth, lead=False)
    return float(said is not None and said == true)


def box_iou(answer: str, truth: str, settings: Settings) -> float:
    said, true = read_boxes(answer), read_boxes(truth)
    if not said or len(true) != 1:
        return 0.0
    value = iou(said[0], true[0])
    if settings.iou_threshold > 0:
        return float(value >= settings.iou_threshold)
    return value


def format_ok(answer: str, truth: str, settings: Settings) -> float:
    body, kind = answer.strip(), kind_of(truth)
    if kind == "box":
        return float(BOX_PATTERN.fullmatch(body) is not None and len(read_boxes(body)) == 1)
    if kind == "number":
        return float(read_number(body, lead=False) is not None)
    if kind == "choice":
        return float(read_choice(body, lead=False) is not None)
    words = len(body.split())
    return float("\n" not in body and 0 < words <= max(4, 2 * len(truth.split())))


BY_KIND: dict[str, Callable[[str, str, Settings], float]] = {"box": box_iou, "number": numeric, "choice": choice,
                                                             "text": exact}


def accuracy(answer: str, truth: str, settings: Settings) -> float:
    return BY_KIND[kind_of(truth)](answer, truth, settings)


REWARDS: dict[str, Callable[[str, str, Settings], float]] = {
    "accuracy": accuracy, "exact": exact, "numeric": numeric, "choice": choice, "iou": box_iou, "format": format_ok}


def score_named(name: str, answer: object, truth: str, settings: Settings) -> float:
    """The named reward `name` of `answer` (0 for junk); never raises."""
    if is_junk(answer, settings.max_answer_chars):
        return 0.0
    value = REWARDS[name](answer.strip(), truth, settings)  # type: ignore[union-attr]
    return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0


def correct(answer: object, truth: str, settings: Settings) -> bool:
    """The answer's correctness bit (accuracy's measure; a box counts at IoU >= 0.5, RefCOCO's): the evaluate
    stage's accuracy and pass@k."""
    if is_junk(answer, settings.max_answer_chars):
        return False
    if kind_of(truth) == "box":
        return box_iou(answer.strip(), truth, Settings(iou_threshold=0.5)) >= 1.0  # type: ignore[union-attr]
    return accuracy(answer.strip(), truth, settings) >= 1.0  # type: ignore[union-attr]
