"""Sampling on fixed logits: the empirical distribution matches the reported sampling log-probs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vlmgym.rollout.sampling import SamplingSettings, hash_uniform, sample_tokens

VOCAB, ROWS = 40, 20000
LOGITS = np.random.default_rng(0).normal(size=VOCAB).astype(np.float32) * 2


def draw(settings: SamplingSettings, seed: int = 1):
    logits = jnp.broadcast_to(jnp.asarray(LOGITS), (ROWS, VOCAB))
    fn = jax.jit(lambda x, s: sample_tokens(x, s, jnp.arange(ROWS), jnp.int32(3), settings))
    return [np.asarray(a) for a in fn(logits, jnp.uint32(seed))]


def expected_probs(temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The filtered distribution written out in numpy, HF's order: temperature, top-k, top-p."""
    scaled = LOGITS.astype(np.float64) / temperature
    order = np.argsort(-scaled)
    keep = np.zeros(VOCAB, bool)
    keep[order[:top_k or VOCAB]] = True
    probs = np.where(keep, np.exp(scaled - scaled.max()), 0)
    probs /= probs.sum()
    sorted_p = probs[order]
    before = np.cumsum(sorted_p) - sorted_p
    nucleus = np.zeros(VOCAB, bool)
    nucleus[order[before < top_p]] = True
    probs = np.where(keep & nucleus, probs, 0)
    return probs / probs.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.8), (1.3, 10, 0.7)])
def test_empirical_distribution_matches(temperature, top_k, top_p):
    tokens, sample_lp, policy_lp = draw(SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p))
    expected = expected_probs(temperature, top_k, top_p)
    counts = np.bincount(tokens, minlength=VOCAB) / ROWS
    # 5 standard errors of a frequency estimate from ROWS draws.
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected * (1 - expected) / ROWS) + 1e-9)
    assert (expected[np.unique(tokens)] > 0).all()  # never a filtered-out token
    np.testing.assert_allclose(np.exp(sample_lp), expected[tokens], rtol=1e-4)
    # The policy's log-prob: the full softmax at the sampling temperature, unfiltered (what the learner recomputes).
    tempered = LOGITS.astype(np.float64) / temperature
    log_softmax = tempered - np.log(np.exp(tempered).sum())
    np.testing.assert_allclose(policy_lp, log_softmax[tokens], atol=1e-5)


def test_greedy_takes_the_argmax_with_zero_sampling_logprob():
    tokens, sample_lp, _ = draw(SamplingSettings(greedy=True))
    assert (tokens == LOGITS.argmax()).all() and (sample_lp == 0).all()


def test_hash_uniform_is_a_counter_function():
    rows = jnp.arange(100000)
    u = np.asarray(hash_uniform(jnp.uint32(5), rows, jnp.int32(2)))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    # A row's number does not depend on which other rows are in the batch.
    np.testing.assert_array_equal(np.asarray(hash_uniform(jnp.uint32(5), rows[77:78], jnp.int32(2))), u[77:78])
    assert not np.array_equal(np.asarray(hash_uniform(jnp.uint32(6), rows, jnp.int32(2))), u)
    assert not np.array_equal(np.asarray(hash_uniform(jnp.uint32(5), rows, jnp.int32(3))), u)
    # Neighbouring rows and steps are uncorrelated.
    next_step = np.asarray(hash_uniform(jnp.uint32(5), rows, jnp.int32(3)))
    assert abs(np.corrcoef(u, next_step)[0, 1]) < 0.02 and abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.02
