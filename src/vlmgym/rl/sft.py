"""Supervised fine-tuning loss: masked next-token cross entropy over the completion tokens only."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vlmgym.rl.grpo import aggregate


def sft_loss(logits: jax.Array, targets: jax.Array, loss_mask: jax.Array,
             normalizer: jax.Array | float | None = None) -> jax.Array:
    """Mean cross entropy of `targets` under `logits` over positions where loss_mask is 1.

    logits [batch, len, vocab] predict targets [batch, len] (already shifted: logits[:, t] is the
    prediction of targets[:, t]); prompt, padding and post-EOS positions carry loss_mask 0.
    `normalizer` replaces the active-token count (the full batch's, under gradient accumulation).
    """
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    target_logprobs = jnp.take_along_axis(log_probs, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return sft_loss_from_logprobs(target_logprobs, loss_mask, normalizer)


def sft_loss_from_logprobs(target_logprobs: jax.Array, loss_mask: jax.Array,
                           normalizer: jax.Array | float | None = None) -> jax.Array:
    """The same loss from the log-probs of the target tokens [batch, len] (e.g. the model's token_logprobs)."""
    return aggregate(-target_logprobs.astype(jnp.float32), loss_mask, "token_mean", normalizer)


def token_accuracy(logits: jax.Array, targets: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Share of active positions where the argmax token equals the target."""
    mask = loss_mask.astype(jnp.float32)
    hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return (hits * mask).sum() / jnp.maximum(mask.sum(), 1.0)
