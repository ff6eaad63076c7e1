"""The rollout engine against transformers generate and the model's own full forward."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import pytest
import torch

from vlmgym.models.qwen3_vl.model import jit_token_logprobs
from vlmgym.rollout.engine import TRACE_COUNTS, RolloutEngine
from vlmgym.rollout.sampling import SamplingSettings

pytestmark = pytest.mark.slow

NEW_TOKENS = 12
GROUP = 4


def engine(model: Any, **settings) -> RolloutEngine:
    base = dict(max_new_tokens=NEW_TOKENS, eos_ids=model.eos_ids, pad_id=model.pad_id)
    return RolloutEngine(model.cfg, model.processor, SamplingSettings(**{**base, **settings}))


@pytest.fixture(scope="module")
def prompts(make_obs) -> list[dict]:
    # Three prompts of different lengths; the second holds two images of different sizes.
    return [make_obs(0), make_obs(1, num_images=2), make_obs(2)]


@pytest.fixture(scope="module")
def greedy(tiny_model: Any, prompts):
    return engine(tiny_model, greedy=True).generate(tiny_model.params, prompts, 1, jax.random.key(0))


@pytest.fixture(scope="module")
def sampled(tiny_model: Any, prompts):
    return engine(tiny_model, temperature=1.0).generate(tiny_model.params, prompts, GROUP, jax.random.key(7))


def hf_greedy(model: Any, inputs: dict) -> np.ndarray:
    """transformers generate's greedy completions for processor inputs."""
    from transformers import Qwen3VLForConditionalGeneration

    hf = Qwen3VLForConditionalGeneration.from_pretrained(model.folder, dtype=torch.float32).eval()
    kwargs = {k: torch.from_numpy(np.asarray(inputs[k]).astype(np.int64))
              for k in ("input_ids", "attention_mask", "mm_token_type_ids", "image_grid_thw") if len(inputs[k])}
    if len(inputs["image_grid_thw"]):
        kwargs["pixel_values"] = torch.from_numpy(inputs["pixel_values"])
    with torch.no_grad():
        out = hf.generate(**kwargs, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=list(model.eos_ids),
                          pad_token_id=model.pad_id)
    return out[:, inputs["input_ids"].shape[1]:].numpy()


def test_greedy_equals_hf_generate(tiny_model: Any, greedy):
    expected = hf_greedy(tiny_model, greedy.prompt_inputs)
    for row in range(len(expected)):
        length = greedy.lengths[row]
        np.testing.assert_array_equal(greedy.completion_ids[row, :length], expected[row, :length])
        # HF pads with pad_id after EOS (or stops early when every row ended).
        assert (expected[row, length:] == tiny_model.pad_id).all()


def test_text_only_prompt_equals_hf_generate(tiny_model: Any):
    obs = [{"images": [], "messages": [{"role": "user", "content": "City: Paris. Region:"}]}]
    batch = engine(tiny_model, greedy=True).generate(tiny_model.params, obs, 1, jax.random.key(0))
    expected = hf_greedy(tiny_model, batch.prompt_inputs)
    length = batch.lengths[0]
    np.testing.assert_array_equal(batch.completion_ids[0, :length], expected[0, :length])


@pytest.mark.parametrize("settings", [dict(temperature=1e-4), dict(top_k=1, temperature=1.0),
                                      dict(top_p=1e-6, temperature=1.0)], ids=["t->0", "top_k=1", "top_p->0"])
def test_degenerate_sampling_equals_greedy(tiny_model: Any, prompts, greedy, settings):
    batch = engine(tiny_model, **settings).generate(tiny_model.params, prompts, GROUP, jax.random.key(3))
    expected = np.repeat(greedy.completion_ids, GROUP, axis=0)
    np.testing.assert_array_equal(batch.completion_ids, expected)
    if settings["temperature"] == 1.0:  # at t -> 0 the log-probs are the tempered policy's (test below)
        np.testing.assert_allclose(batch.logprobs, np.repeat(greedy.logprobs, GROUP, axis=0), atol=1e-5)


def test_seed_determinism(tiny_model: Any, prompts, sampled):
    sampler = engine(tiny_model, temperature=1.0)
    again = sampler.generate(tiny_model.params, prompts, GROUP, jax.random.key(7))
    np.testing.assert_array_equal(again.completion_ids, sampled.completion_ids)
    np.testing.assert_array_equal(again.logprobs, sampled.logprobs)
    other = sampler.generate(tiny_model.params, prompts, GROUP, jax.random.key(8))
    assert (other.completion_ids != sampled.completion_ids).mean() > 0.3
    # The samples of one group differ from each other too (each row has its own stream).
    assert len({tuple(r) for r in sampled.completion_ids[:GROUP]}) == GROUP


def test_logprobs_equal_full_forward(tiny_model: Any, sampled):
    inputs = jax.tree.map(jax.numpy.asarray, sampled.sequence_inputs())
    recomputed = jit_token_logprobs(tiny_model.params, tiny_model.cfg, inputs, sampled.completion_ids,
                                    sampled.completion_mask)
    np.testing.assert_allclose(np.asarray(recomputed), sampled.logprobs, atol=1e-5, rtol=0)
    # At temperature 1 without filtering the sampling distribution is the plain softmax.
    np.testing.assert_allclose(sampled.sample_logprobs, sampled.logprobs, atol=1e-5)
    assert (sampled.logprobs[sampled.completion_mask > 0] < 0).all()


def test_tempered_logprobs_equal_the_learners_at_that_temperature(tiny_model: Any, prompts):
    # The sampler returns log-probs under softmax(logits / T) over the whole vocabulary, and the learner recomputes
    # the same at T: the importance ratio refers to the policy that was sampled (top-k is left out of both).
    sampled = engine(tiny_model, temperature=0.7, top_k=50).generate(tiny_model.params, prompts, GROUP,
                                                                     jax.random.key(5))
    inputs = jax.tree.map(jax.numpy.asarray, sampled.sequence_inputs())
    args = (tiny_model.params, tiny_model.cfg, inputs, sampled.completion_ids, sampled.completion_mask)
    tempered = np.asarray(jit_token_logprobs(*args, temperature=0.7))
    np.testing.assert_allclose(tempered, sampled.logprobs, atol=1e-5, rtol=0)
    untempered = np.asarray(jit_token_logprobs(*args))
    active = sampled.completion_mask > 0
    assert np.abs(untempered - sampled.logprobs)[active].max() > 1e-2  # the old, untempered ratio was off


def test_prefix_shared_equals_per_copy(tiny_model: Any, prompts):
    sampler = engine(tiny_model, temperature=1.0, top_k=50, top_p=0.9)
    shared = sampler.generate(tiny_model.params, prompts[1:2], GROUP, jax.random.key(11))
    copies = sampler.generate(tiny_model.params, prompts[1:2] * GROUP, 1, jax.random.key(11))
    np.testing.assert_array_equal(shared.completion_ids, copies.completion_ids)
    np.testing.assert_allclose(shared.logprobs, copies.logprobs, atol=1e-5)
    np.testing.assert_allclose(shared.sample_logprobs, copies.sample_logprobs, atol=1e-5)


def test_nothing_after_eos_counts(tiny_model: Any, prompts, sampled):
    # Declare the most frequent sampled tokens EOS, so rows end at different steps (or not at all).
    values, counts = np.unique(sampled.completion_ids, return_counts=True)
    eos_ids = tuple(int(v) for v in values[np.argsort(-counts)[:3]])
    sampler = engine(tiny_model, temperature=1.0, eos_ids=eos_ids)
    batch = sampler.generate(tiny_model.params, prompts, GROUP, jax.random.key(7))
    ended = [r for r, reason in enumerate(batch.finish_reasons) if reason == "eos"]
    assert ended and any(batch.lengths[r] < NEW_TOKENS for r in ended)
    for row in range(len(batch.lengths)):
        length = batch.lengths[row]
        ids = batch.completion_ids[row]
        hits = np.flatnonzero(np.isin(ids[:length], eos_ids))
        if batch.finish_reasons[row] == "eos":
            assert hits.tolist() == [length - 1]  # the first EOS is the last counted token
        else:
            assert length == NEW_TOKENS and hits.size == 0
        assert batch.completion_mask[row, :length].all() and not batch.completion_mask[row, length:].any()
        assert (ids[length:] == tiny_model.pad_id).all()
        assert (batch.logprobs[row, length:] == 0).all() and (batch.sample_logprobs[row, length:] == 0).all()
        assert (batch.logprobs[row, :length] < 0).all()
    # Same key, same rows: up to each row's EOS the tokens are those of the run without EOS.
    for row in ended:
        np.testing.assert_array_equal(batch.completion_ids[row, :batch.lengths[row]],
                                      sampled.completion_ids[row, :batch.lengths[row]])


def test_buckets_reuse_compiles(tiny_model: Any, prompts, sampled, make_obs):
    sampler = engine(tiny_model, temperature=1.0)
    before = dict(TRACE_COUNTS)
    # Four prompts instead of three: same prompt-count bucket (4), same length bucket -> no new compile.
    batch = sampler.generate(tiny_model.params, prompts + [make_obs(4)], GROUP, jax.random.key(5))
    assert dict(TRACE_COUNTS) == before
    assert batch.completion_ids.shape == (4 * GROUP, NEW_TOKENS)
    assert batch.prompt_index.tolist() == np.repeat(np.arange(4), GROUP).tolist()


def test_settings_are_validated():
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingSettings(temperature=-1.0)
    assert dataclasses.replace(SamplingSettings(), top_k=1).is_greedy
