"""SFT loss against hand computation."""

import math

import jax.numpy as jnp
import pytest

from vlmgym.rl.sft import sft_loss, sft_loss_from_logprobs, token_accuracy


def test_sft_loss_hand_example_counts_only_completion_tokens():
    logits = jnp.array([[[0.0, math.log(3.0)], [0.0, 0.0], [50.0, -50.0]]])
    targets = jnp.array([[1, 0, 1]])
    mask = jnp.array([[1, 1, 0]])  # the last position (a prompt or post-EOS token) is ignored
    expected = (-math.log(0.75) - math.log(0.5)) / 2
    assert float(sft_loss(logits, targets, mask)) == pytest.approx(expected, rel=1e-6)
    assert float(sft_loss(logits, targets, mask, normalizer=4.0)) == pytest.approx(expected / 2, rel=1e-6)
    target_logprobs = jnp.array([[math.log(0.75), math.log(0.5), -100.0]])
    assert float(sft_loss_from_logprobs(target_logprobs, mask)) == pytest.approx(expected, rel=1e-6)
    # argmax is 1 then 0 (ties go to the first index): both right; flipped targets are both wrong.
    assert float(token_accuracy(logits, targets, mask)) == 1.0
    assert float(token_accuracy(logits, jnp.array([[0, 1, 0]]), mask)) == 0.0
