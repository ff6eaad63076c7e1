"""Prefill + decode steps, cache repetition and token log-probs agree with one full forward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from qwen_fixtures import hf_positions, image_prompt, make_batch

from vlmgym.models.qwen3_vl import model as qwen
from vlmgym.models.qwen3_vl.vision import encode_patches, patch_layout

pytestmark = pytest.mark.slow

STEPS = 3
CACHE = 64


@pytest.fixture(scope="module")
def setup(tiny_tied):
    """A left-padded batch (two images in row 0, text in row 1), its features and a full-forward reference."""
    tiny = tiny_tied
    rng = np.random.default_rng(7)
    grids = [(1, 4, 4), (1, 2, 6)]
    rows = [image_prompt(rng, grids), [int(i) for i in rng.integers(0, 250, 6)]]
    batch = make_batch(rows, grids, seed=7)
    positions = hf_positions(tiny.hf, batch)
    layout = patch_layout(tiny.cfg, grids)
    image_embeds, deepstack = encode_patches(tiny.params, tiny.cfg, jnp.asarray(batch["pixel_values"]), layout)
    completion = rng.integers(0, 250, (2, STEPS)).astype(np.int32)
    # Reference: one forward over prompt + completion with continued positions.
    prompt_len = batch["input_ids"].shape[1]
    next_pos = np.where(batch["attention_mask"] == 1, positions.max(0), -1).max(1) + 1
    full_positions = np.concatenate(
        [positions, np.broadcast_to((next_pos[:, None] + np.arange(STEPS))[None], (3, 2, STEPS))], axis=2)
    full_ids = np.concatenate([batch["input_ids"], completion], axis=1)
    full_mask = np.concatenate([batch["attention_mask"], np.ones((2, STEPS), np.int64)], axis=1)
    reference = np.asarray(qwen.jit_forward(tiny.params, tiny.cfg, jnp.asarray(full_ids), jnp.asarray(full_mask),
                                            jnp.asarray(full_positions), image_embeds, deepstack))
    return dict(tiny=tiny, batch=batch, positions=positions, layout=layout, image_embeds=image_embeds,
                deepstack=deepstack, completion=completion, reference=reference, prompt_len=prompt_len)


def _prefill(s, input_ids, mask, positions, cache_size=CACHE):
    return qwen.jit_prefill(s["tiny"].params, s["tiny"].cfg, jnp.asarray(input_ids), jnp.asarray(mask),
                            jnp.asarray(positions), s["image_embeds"], s["deepstack"], cache_size=cache_size)


def _decode(s, logits, cache, completion):
    """Logits of the prefill then of each decode step fed with the fixed completion tokens."""
    out = [np.asarray(logits)]
    for step in range(completion.shape[1] - 1):
        logits, cache = qwen.jit_decode_step(s["tiny"].params, s["tiny"].cfg, jnp.asarray(completion[:, step]), cache)
        out.append(np.asarray(logits))
    return np.stack(out, axis=1), cache


def test_prefill_and_decode_equal_full_forward(setup):
    s = setup
    logits, cache = _prefill(s, s["batch"]["input_ids"], s["batch"]["attention_mask"], s["positions"])
    assert cache["k"].shape == (4, 2, CACHE, 2, 32)
    got, cache = _decode(s, logits, cache, s["completion"])
    expected = s["reference"][:, s["prompt_len"] - 1: s["prompt_len"] + STEPS - 1]
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    assert int(cache["index"]) == s["prompt_len"] + STEPS - 1


def test_right_padded_prompts_decode_the_same(setup):
    s = setup
    mask = s["batch"]["attention_mask"]
    ids, positions = np.zeros_like(s["batch"]["input_ids"]), np.zeros_like(s["positions"])
    for row in range(2):  # move each row's tokens to the left edge
        n = int(mask[row].sum())
        ids[row, :n] = s["batch"]["input_ids"][row, mask[row] == 1]
        positions[:, row, :n] = s["positions"][:, row, mask[row] == 1]
    right_mask = (np.arange(mask.shape[1])[None] < mask.sum(1, keepdims=True)).astype(np.int64)
    logits, cache = _prefill(s, ids, right_mask, positions)
    got, _ = _decode(s, logits, cache, s["completion"])
    expected = s["reference"][:, s["prompt_len"] - 1: s["prompt_len"] + STEPS - 1]
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def test_repeated_cache_equals_repeated_prefill(setup):
    s = setup
    group = 2
    logits, cache = _prefill(s, s["batch"]["input_ids"], s["batch"]["attention_mask"], s["positions"])
    cache = qwen.repeat_cache(cache, group)
    tokens = np.repeat(s["completion"], group, axis=0)
    got, _ = _decode(s, jnp.repeat(logits, group, axis=0), cache, tokens)
    expected = np.repeat(s["reference"][:, s["prompt_len"] - 1: s["prompt_len"] + STEPS - 1], group, axis=0)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)


def _learner_inputs(s):
    """The setup's prompts as the learner's inputs, and a completion mask whose second row ends a token early."""
    inputs = {"input_ids": jnp.asarray(s["batch"]["input_ids"]),
              "attention_mask": jnp.asarray(s["batch"]["attention_mask"]),
              "position_ids": jnp.asarray(s["positions"]), "pixel_values": jnp.asarray(s["batch"]["pixel_values"]),
              "patch_layout": s["layout"]}
    return inputs, np.array([[1, 1, 1], [1, 1, 0]], np.int32)


def test_token_entropies_are_the_entropy_of_the_full_forwards_logits(setup):
    s = setup
    tiny = s["tiny"]
    inputs, completion_mask = _learner_inputs(s)
    logprobs, entropies = qwen.jit_token_logprobs(tiny.params, tiny.cfg, inputs, jnp.asarray(s["completion"]),
                                                  jnp.asarray(completion_mask), with_entropy=True)
    ref = s["reference"][:, s["prompt_len"] - 1: s["prompt_len"] + STEPS - 1].astype(np.float64)
    log_p = ref - ref.max(-1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(-1, keepdims=True))
    expected = -(np.exp(log_p) * log_p).sum(-1) * completion_mask
    np.testing.assert_allclose(np.asarray(entropies), expected, atol=1e-4, rtol=0)
    assert np.asarray(entropies)[1, 2] == 0.0 and np.asarray(entropies)[0].min() > 0
    plain = qwen.jit_token_logprobs(tiny.params, tiny.cfg, inputs, jnp.asarray(s["completion"]),
                                    jnp.asarray(completion_mask))
    np.testing.assert_array_equal(np.asarray(logprobs), np.asarray(plain))


def test_token_logprobs_match_forward_and_are_differentiable(setup):
    s = setup
    tiny = s["tiny"]
    inputs, completion_mask = _learner_inputs(s)

    def total(params):
        logprobs = qwen.token_logprobs(params, tiny.cfg, inputs, jnp.asarray(s["completion"]),
                                       jnp.asarray(completion_mask), remat=True)
        return logprobs.sum(), logprobs

    # One compile gives both the values and the gradients the learner needs.
    (_, got), grads = jax.jit(jax.value_and_grad(total, has_aux=True))(tiny.params)
    got = np.asarray(got)
    ref = s["reference"][:, s["prompt_len"] - 1: s["prompt_len"] + STEPS - 1]
    ref = ref - np.log(np.exp(ref - ref.max(-1, keepdims=True)).sum(-1, keepdims=True)) - ref.max(-1, keepdims=True)
    expected = np.take_along_axis(ref, s["completion"][..., None], axis=-1)[..., 0] * completion_mask
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    assert got[1, 2] == 0.0
    norms = [float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)]
    assert all(np.isfinite(norms))
    assert float(jnp.abs(grads["visual"]["pos_embed"]).max()) > 0  # gradients reach the vision tower
