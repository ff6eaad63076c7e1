"""nlvr2: two images and a statement about them; the answer is True or False; reward 1 or 0."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from vlmgym.data import nlvr2 as nlvr2_data
from vlmgym.envs.base import Env, SampleLike, State

# Whole words only: "untrue" is not "true", "known" is not "no".
ANSWER_PATTERN = re.compile(r"\b(true|false|yes|no)\b", re.IGNORECASE)
ANSWER_VALUES = {"true": True, "yes": True, "false": False, "no": False}
# A well-formatted answer is exactly the one word asked for, optionally followed by a full stop.
FORMAT_PATTERN = re.compile(r"\s*(true|false)\s*\.?\s*", re.IGNORECASE)

PROMPT = ("The first image is the left image and the second image is the right image.\n"
          "Statement: {sentence}\n"
          "Is the statement true or false? Answer with one word: True or False.")


def parse_answer(text: str) -> bool | None:
    """True / False from the answer words in `text`; None when it has none or both (never guess a side)."""
    values = {ANSWER_VALUES[word.lower()] for word in ANSWER_PATTERN.findall(text or "")}
    return values.pop() if len(values) == 1 else None


def answer_word(value: bool) -> str:
    """The canonical answer for a truth value."""
    return "True" if value else "False"


class NLVR2Env(Env):
    """Decide whether a statement about a left and a right image is true; samples come from webdataset shards."""

    name = "nlvr2"

    def __init__(self, samples: Sequence[SampleLike] | None = None, **kwargs: Any) -> None:
        super().__init__(samples, **kwargs)
        for sample in self.samples:
            _check_sample(sample)

    def prompt(self, sample: SampleLike) -> str:
        """The statement and the one-word question."""
        return PROMPT.format(sentence=sample.meta["sentence"])

    def prepare_truth(self, sample: SampleLike) -> bool:
        """The sample's truth value."""
        return sample.meta["label"]

    def score(self, state: State, text: str) -> tuple[float, dict]:
        """1 when the answer names the right truth value unambiguously, else 0."""
        answer = parse_answer(text)
        correct = answer is not None and answer == state.truth
        reward = 1.0 if correct else 0.0
        info = {
            "answer": None if answer is None else answer_word(answer),
            "pred_label": answer,
            "label": answer_word(state.truth),
            "correct": correct,
            "format_ok": FORMAT_PATTERN.fullmatch(text or "") is not None,
            "parse_failed": answer is None,
            "reward_components": {"correct": reward},
        }
        return reward, info

    @staticmethod
    def ideal_answer(meta: dict[str, Any]) -> str:
        """The SFT target for a sample's meta: 'True' or 'False'."""
        return answer_word(meta["label"])

    @classmethod
    def corpus(cls) -> list[str]:
        """Prompt, answer words and example statements covering the synthetic vocabulary (tokenizer training)."""
        vocabulary = " ".join([*nlvr2_data.NUMBER_WORDS, *nlvr2_data.COLOURS, *nlvr2_data.SIZES, *nlvr2_data.SIDES,
                               *nlvr2_data.RELATIONS, *nlvr2_data.SHAPES, *(s + "s" for s in nlvr2_data.SHAPES)])
        return [PROMPT.format(sentence=""), "True", "False", "true", "false", "yes", "no", "Yes", "No", vocabulary,
                *nlvr2_data.statement_corpus()]


def _check_sample(sample: SampleLike) -> None:
    if len(sample.images) != 2:
        raise ValueError(f"nlvr2: sample {sample.key} has {len(sample.images)} images, expected 2 (left, right)")
    sentence, label = sample.meta.get("sentence"), sample.meta.get("label")
    if not isinstance(sentence, str) or not sentence.strip():
        raise ValueError(f"nlvr2: sample {sample.key} has no sentence (meta {sample.meta!r})")
    if not isinstance(label, bool):
        raise ValueError(f"nlvr2: sample {sample.key} has label {label!r}, expected true or false")
