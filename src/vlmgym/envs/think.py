"""The R1 think/answer convention (DeepSeek-R1, used by r1_vlm and VLM-R1), as an option of every env.

With `env.<name>.think: true` the prompt asks the model to reason inside `<think>...</think>` and to give its
final answer inside `<answer>...</answer>`; the env scores only what is inside the first complete
`<answer>...</answer>` (the empty string when there is none or it holds a think or answer tag, which every
built-in env scores 0), and a structure component rewards the shape itself:

    reward = think_format_weight x structure_ok + (1 - think_format_weight) x the env's reward of the answer

structure_ok: the whole response is one think block then one answer block, give or take whitespace around and
between them (VLM-R1's `<think>.*?</think>\\s*<answer>.*?</answer>` matched against the full text), with no
further tag of either kind inside. The SFT target is the env's ideal answer inside the tags, after an empty think
block: there is no reasoning trace to imitate, so SFT teaches the shape and the answer and leaves the thinking
to RL.

`<think>` and `</think>` are single tokens of Qwen3's tokenizer (and of the tiny one, vlmgym.models.qwen3_vl
.base_model.PLAIN_ADDED_TOKENS); the answer tags are plain text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vlmgym.config.spec import spec

# VLM-R1's question template's instruction (its QUESTION_TEMPLATE ends with this sentence).
INSTRUCTION = ("First output the thinking process in <think> </think> tags and then output the final answer in "
               "<answer> </answer> tags.")
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
STRUCTURE = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
COMPONENT = "think_format"


@dataclass(frozen=True)
class ThinkParams:
    """The R1 think/answer option every built-in env's section (env.<name>) has; a plug-in env's Params may
    subclass it to offer the option too."""

    think: bool = spec(False, doc="R1 convention: ask for <think>...</think><answer>...</answer>, score only the "
                                  "answer block and reward the structure (off for the tiny default model)")
    think_format_weight: float = spec(0.1, ge=0, le=1, doc="with think: share of the reward for the "
                                                            "think-then-answer structure")


def prompt(question: str) -> str:
    """The env's question followed by the R1 instruction."""
    return f"{question} {INSTRUCTION}"


def structure_ok(text: str) -> bool:
    """One think block then one answer block and nothing else but whitespace; no stray tags inside."""
    match = STRUCTURE.fullmatch(text)
    return match is not None and not any(tag in part for part in match.groups() for tag in TAGS)


def answer(text: str) -> str:
    """What the first complete answer block holds, stripped ("" when there is none, or when it holds one of the
    tags: `<answer><answer>7</answer>` or a think block inside the answer is not an answer, and a lenient env
    parser would otherwise read through the tags)."""
    match = ANSWER.search(text)
    if match is None or any(tag in match.group(1) for tag in TAGS):
        return ""
    return match.group(1).strip()


def target(ideal: str) -> str:
    """The SFT target: an empty think block, then the ideal answer in the answer block."""
    return f"<think>\n</think>\n<answer>\n{ideal}\n</answer>"


def combine(inner_reward: float, info: dict, ok: bool, weight: float) -> tuple[float, dict]:
    """The env's (reward, info) of the answer block combined with the structure component. The env's own
    components stay as it reported them (they describe the answer block; some, like geospot's per-level scores
    and weights, are not shares of the total), `think_format` (weight x structure_ok) joins them, and format_ok
    requires both the answer's format and the structure."""
    components = {**(info.get("reward_components") or {}), COMPONENT: weight * ok}
    info = {**info, "reward_components": components, "answer_reward": inner_reward, "think_format_ok": ok,
            "format_ok": bool(info.get("format_ok")) and ok}
    return min(1.0, max(0.0, (1.0 - weight) * inner_reward + weight * ok)), info
