"""An SFT run whose targets mostly do not fit sft.max_target_tokens stops before its warm-up and first step, naming
the budget and the longest target; a rare long target is left to the trainer's counted skip."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vlmgym.rl.sft_trainer import check_target_budget


class WordTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(range(len(text.split())))


class Answers:
    """A one-turn env whose sample i's ideal answer is `lengths[i]` words."""

    def __init__(self, lengths: list[int]):
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def reset(self, index: int):
        return SimpleNamespace(meta={"words": self.lengths[index]}), {"question": "?"}

    def sft_target(self, meta: dict) -> str:
        return " ".join(["w"] * meta["words"])


def _policy(budget: int):
    return SimpleNamespace(max_new_tokens=budget, processor=SimpleNamespace(tokenizer=WordTokenizer()))


def test_most_targets_too_long_fail_at_once_naming_the_budget_and_the_longest():
    env = Answers([70, 90, 132, 40, 100, 5000])  # the last is past the samples checked
    with pytest.raises(ValueError, match=r"sft.max_target_tokens=64 is shorter than 4 of the first 5 SFT targets "
                                         r"\(the longest 133 tokens with its end-of-turn token\)"):
        check_target_budget(_policy(64), env, samples=5)


def test_targets_that_fit_or_a_few_too_long_pass():
    check_target_budget(_policy(64), Answers([10, 63, 20, 30]), samples=4)  # 63 words + the end: exactly 64
    check_target_budget(_policy(64), Answers([10, 100, 20, 30]), samples=4)  # one of four: the trainer skips it
    with pytest.raises(ValueError, match="3 of the first 4"):
        check_target_budget(_policy(64), Answers([64, 100, 20, 70]), samples=4)
