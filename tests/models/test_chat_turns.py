"""Conversations of several turns: tool schemas in the system turn, tool results as user turns, and assistant turns
encoded from the token ids the policy sampled."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

from vlmgym.models.qwen3_vl.base_model import TINY_MAX_PIXELS, TINY_MIN_PIXELS, train_tokenizer
from vlmgym.models.qwen3_vl.processor import QWEN3_VL_CHAT_TEMPLATE as TEMPLATE
from vlmgym.models.qwen3_vl.processor import TOKEN_IDS, build_inputs, chat_pieces, render_chat

TOOLS = [{"type": "function", "function": {"name": "zoom", "description": "Look closer at a region.",
                                           "parameters": {"type": "object", "required": ["x1", "y1", "x2", "y2"],
                                                          "properties": {k: {"type": "number"}
                                                                         for k in ("x1", "y1", "x2", "y2")}}}}]
CALL = '<tool_call>\n{"name": "zoom", "arguments": {"x1": 0, "y1": 0, "x2": 500, "y2": 500}}\n</tool_call>'
TEXTS = ["Which digits are in the image? Answer: 3, 5, 7", CALL, "zoom (0, 0, 500, 500): the region shown"] * 4


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=400)


def two_turns(answer: str = CALL) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which digits?"}]},
            {"role": "assistant", "content": answer},
            {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "zoom (0, 0, 500, 500)"}]}]


def image(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8))


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_with_tools_and_tool_turns_equals_transformers(tokenizer, add_generation_prompt):
    ours = render_chat(two_turns(), add_generation_prompt, TEMPLATE, TOOLS)
    theirs = tokenizer.apply_chat_template(two_turns(), tools=TOOLS, tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
    assert ours == theirs
    assert ours.startswith("<|im_start|>system\n# Tools\n") and '"name": "zoom"' in ours
    assert (f"<|im_start|>assistant\n{CALL}<|im_end|>\n<|im_start|>user\n<tool_response>\n"
            "<|vision_start|><|image_pad|><|vision_end|>zoom (0, 0, 500, 500)\n</tool_response><|im_end|>\n") in ours


def test_sampled_token_ids_stand_where_the_assistant_text_is(tokenizer):
    messages = two_turns()
    canonical = tokenizer(CALL + "<|im_end|>", add_special_tokens=False)["input_ids"]
    with_ids = [*messages[:1], {**messages[1], TOKEN_IDS: canonical}, *messages[2:]]
    settings = dict(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS, batch_of_tools=[TOOLS])
    as_text = build_inputs(tokenizer, [messages], [[image(0), image(1)]], **settings)
    as_ids = build_inputs(tokenizer, [with_ids], [[image(0), image(1)]], **settings)
    for key in ("input_ids", "attention_mask", "position_ids", "pixel_values"):
        np.testing.assert_array_equal(as_ids[key], as_text[key])
    # A split the tokenizer would not make itself (one id per character) is kept as sampled.
    spelled = [i for ch in CALL for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]
    spelled.append(canonical[-1])
    kept = build_inputs(tokenizer, [[*messages[:1], {**messages[1], TOKEN_IDS: spelled}, *messages[2:]]],
                        [[image(0), image(1)]], **settings)
    row = kept["input_ids"][0][kept["attention_mask"][0] == 1].tolist()
    assert len(spelled) > len(canonical)
    assert any(row[i:i + len(spelled)] == spelled for i in range(len(row)))
    assert len(row) == as_text["prompt_lengths"][0] + len(spelled) - len(canonical)


def test_token_ids_must_end_the_turn_and_belong_to_an_assistant_text(tokenizer):
    messages = two_turns()
    ids = tokenizer(CALL, add_special_tokens=False)["input_ids"]  # no <|im_end|>
    with pytest.raises(ValueError, match=re.escape("must end with <|im_end|>")):
        build_inputs(tokenizer, [[messages[0], {**messages[1], TOKEN_IDS: ids}, messages[2]]],
                     [[image(0), image(1)]], min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    with pytest.raises(ValueError, match="message 0"):
        chat_pieces([{**messages[0], TOKEN_IDS: [1]}], True, TEMPLATE)
