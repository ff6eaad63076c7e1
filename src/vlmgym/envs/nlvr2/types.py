"""Which synthetic template a statement came from, read back from its wording, and nlvr2's per-type accuracy.

Rollout records keep the sentence, not the template (the raw layout is the hub's: id, sentence, label, left,
right), so the type is recovered from the text. Every template's wording is fixed (data.py), so the patterns below
recover the generator's template exactly (tests/envs/test_nlvr2_types.py checks it on every template); a sentence
of the real NLVR2 matches none and is typed None, left out of every per-type accuracy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vlmgym.stats.bootstrap import Statistic

_SIDE = r"(?:left|right)"
_A = r"an? "
# template -> (report label, pattern); the label names the skill it needs (counting / colour / spatial /
# cross-image split), the order is the report's.
TEMPLATE_TYPES: dict[str, tuple[str, re.Pattern]] = {
    "exists": ("existence: there is / both / neither (X)",
               re.compile(rf"There is {_A}.+ in the {_SIDE} image\.|Both images contain {_A}.+\."
                          rf"|Neither image contains {_A}.+\.")),
    "count_exact": ("counting: exactly n X in one image",
                    re.compile(rf"There (?:is|are) exactly \w+ .+ in the {_SIDE} image\.")),
    "count_at_least": ("counting: at least n X in one image",
                       re.compile(rf"The {_SIDE} image contains at least \w+ .+\.")),
    "every_colour": ("colour: every X in one image is <colour>",
                     re.compile(rf"Every \w+ in the {_SIDE} image is \w+\.")),
    "spatial": ("spatial: X left of / right of / above / below Y",
                re.compile(rf"In the {_SIDE} image, there is {_A}.+ (?:to the left of|to the right of|above|below) "
                           rf"{_A}.+\.")),
    "count_total": ("cross-image: exactly n X in both images together",
                    re.compile(r"There are exactly \w+ .+ in the two images combined\.")),
    "compare": ("cross-image: one image has more / fewer X",
                re.compile(rf"The {_SIDE} image has (?:more|fewer) .+ than the {_SIDE} image\.")),
    "same_number": ("cross-image: same number of X", re.compile(r"Both images contain the same number of .+\.")),
    "exactly_one_image": ("cross-image: exactly one image has X",
                          re.compile(rf"Exactly one of the two images contains {_A}.+\.")),
}


def statement_type(sentence: Any) -> str | None:
    """The template a synthetic statement came from, or None (a hub sentence, anything else)."""
    if not isinstance(sentence, str):
        return None
    found = [name for name, (_, pattern) in TEMPLATE_TYPES.items() if pattern.fullmatch(sentence.strip())]
    if len(found) > 1:  # the templates' wordings are disjoint; two matches means a pattern is too loose
        raise RuntimeError(f"statement {sentence!r} matches templates {found}")
    return found[0] if found else None


def metric_name(template: str) -> str:
    """The metric key of a template's accuracy."""
    return f"accuracy_{template}"


def metric_rows() -> dict[str, tuple[str, str]]:
    """metric -> (table label, kind) of every per-type accuracy."""
    return {metric_name(t): (f"accuracy, {label}", "rate") for t, (label, _) in TEMPLATE_TYPES.items()}


def type_statistics(records: Sequence[Mapping[str, Any]], correct: np.ndarray) -> dict[str, Statistic]:
    """Per-template accuracy as ratios over all records (a record of another type adds 0 / 0), so the shared
    bootstrap resamples whole test sets and the paired differences stay paired; types absent from `records` are
    left out (the real NLVR2 has none)."""
    types = [statement_type((r.get("truth") or {}).get("sentence")) for r in records]
    stats = {}
    for template in TEMPLATE_TYPES:
        member = np.array([t == template for t in types], np.float64)
        if member.any():
            stats[metric_name(template)] = Statistic("ratio", member * correct, member)
    return stats
