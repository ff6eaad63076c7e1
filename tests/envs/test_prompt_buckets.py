"""Each built-in single-image env's longest prompt fits the prompt-length bucket its step cost was sized for.

The engine and the learner pad every prompt up to a power-of-two bucket (rollout.engine.Buckets), so a prompt one
token over 64 or 128 doubles the prompt's share of every SFT, GRPO and rollout step. rec's first wording took 148
tokens (bucket 256) and its default pipeline 36 min against geospot's 20; these pin the wordings that fit. The
tokenizer is the default tiny one (trained on the env's corpus as the base_model stage does), the image a 256x192
one at the tiny model's pixel budget (12 tokens), the chat template Qwen3-VL's."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from vlmgym import envs
from vlmgym.envs.message_decoding.data import ALPHABET
from vlmgym.envs.nlvr2.data import COLOURS, SHAPES, SIZES, NLVR2DataParams, NounPhrase, generate_split
from vlmgym.envs.rec.scene import RELATIONS, Expression
from vlmgym.models.qwen3_vl.base_model import TINY_MAX_PIXELS, TINY_MIN_PIXELS, train_tokenizer
from vlmgym.models.qwen3_vl.processor import ImageSettings, build_inputs


def _rec_expressions() -> list[str]:
    """Every full description alone, and with each relation to three anchors (the generator's own wording)."""
    phrases = [NounPhrase(*words) for words in itertools.product(SIZES, sorted(COLOURS), SHAPES)]
    return [Expression(target, relation, anchor).text() for target in phrases for relation in RELATIONS
            for anchor in phrases[:3]] + [Expression(target).text() for target in phrases]


# env -> (the metas whose prompts are measured, the bucket the longest must fit)
CASES = {
    "geospot": ([{}], 64),
    "digits": ([{"task": "sort"}, {"task": "sum"}], 64),
    # test_ood's words are the longest (10 letters)
    "message_decoding": ([{"coded": "x" * n} for n in (3, 8, 10)], 64),
    "rec": ([{"expression": text} for text in _rec_expressions()], 128),
}


def _prompt_length(tokenizer, text: str, image_count: int) -> int:
    """Tokens of a user message with `image_count` 256x192 images and `text`, through the chat template."""
    image = Image.fromarray(np.full((192, 256, 3), 128, np.uint8))
    messages = [{"role": "user", "content": [{"type": "image"}] * image_count + [{"type": "text", "text": text}]}]
    inputs = build_inputs(tokenizer, [messages], [[image] * image_count],
                          settings=ImageSettings(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS))
    assert int(inputs["image_tokens"][0]) == 12 * image_count
    return int(inputs["prompt_lengths"][0])


@pytest.mark.parametrize("name", sorted(CASES))
def test_longest_prompt_fits_its_bucket(name):
    metas, bucket = CASES[name]
    tokenizer = train_tokenizer(envs.corpus(name))
    env_class = envs.env_class(name)
    default = SimpleNamespace(params=env_class.Params())  # the env's default settings, no samples needed
    prompts = [env_class.prompt(default, SimpleNamespace(meta=meta)) for meta in metas]
    longest = max(prompts, key=lambda text: len(tokenizer(text)["input_ids"]))
    length = _prompt_length(tokenizer, longest, 1)
    assert bucket // 2 < length <= bucket, f"{name}: the longest prompt is {length} tokens: {longest!r}"


@pytest.mark.parametrize("letters", ["spaced", "pairs"])
def test_message_decoding_spelled_out_fits_64(letters):
    # these forms write the coded word letter by letter: test_ood's 10-letter words still fit the bucket
    env_class = envs.env_class("message_decoding")
    tokenizer = train_tokenizer(envs.corpus("message_decoding"))
    for coded in ("x" * 10, "qjzxkvbwyf"):
        env = env_class([SimpleNamespace(key="k", images=[None], meta={"coded": coded, "decoder": ALPHABET,
                                                                        "answer": coded})],
                        params=env_class.Params(letters=letters))
        assert 32 < _prompt_length(tokenizer, env.prompt(env.samples[0]), 1) <= 64, coded


@pytest.mark.parametrize("trace", [True, False])
def test_nlvr2_default_prompts_fit_128_with_their_two_images(trace):
    # nlvr2's tokenizer corpus is part of the default (geospot) tokenizer, so its prompts are pinned here rather
    # than given new corpus text: the question asking for the trace first must fit the bucket as the one-word one
    tokenizer = train_tokenizer(envs.corpus("nlvr2"))
    pairs = generate_split(0, "test", 300, 256, 192, **NLVR2DataParams().knobs())
    env = envs.env_class("nlvr2")([SimpleNamespace(key=p.id, images=[None, None], meta={
        "sentence": p.sentence, "label": p.label, "trace": p.trace}) for p in pairs],
        params=envs.env_class("nlvr2").Params(trace=trace))
    longest = max((env.prompt(sample) for sample in env.samples), key=lambda text: len(tokenizer(text)["input_ids"]))
    assert ("Say what each image holds" in longest) is trace
    assert 64 < _prompt_length(tokenizer, longest, 2) <= 128, longest
