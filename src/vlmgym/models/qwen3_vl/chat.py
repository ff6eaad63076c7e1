"""Qwen3-VL's conversation tokens and what a multi-turn conversation needs of them: the one module the envs' tool
episodes (vlmgym.envs.multiturn) and the processor share, light enough for the data stages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

IMAGE_PAD = "<|image_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
END_OF_TURN = "<|im_end|>"

# An assistant message may carry the token ids the policy sampled for it (ending with <|im_end|>): the conversation
# is then encoded with those ids where its text stands, so a later turn sees exactly the tokens that were generated
# (re-encoding the decoded text can split it differently) and the learner scores the context the sampler saw.
TOKEN_IDS = "token_ids"


def continues_conversation(tokenizer: Any, token_ids: Sequence[int]) -> bool:
    """Whether a conversation can go on after an assistant turn that sampled `token_ids` (through its first EOS):
    the turn ended with <|im_end|> (not cut at the length budget, not another EOS) and holds no vision token (a
    sampled <|image_pad|> would stand for an image that is not there)."""
    ids = [int(i) for i in token_ids]
    vision = {tokenizer.convert_tokens_to_ids(token) for token in (IMAGE_PAD, VISION_START, VISION_END)}
    return bool(ids) and ids[-1] == tokenizer.convert_tokens_to_ids(END_OF_TURN) and not vision & set(ids)
