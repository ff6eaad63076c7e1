"""PPO as pure functions: token-level rewards, GAE, advantage whitening, the value head and its clipped loss.

Conventions as in vlmgym.rl.grpo ([batch, completion_len] per-token arrays, `mask` 1 through the first EOS). The
episode is the completion: token t's state is the prompt plus tokens < t, the action is token t, and the task
reward arrives with the last counted token (the EOS, or the last token of a truncated answer). Following TRL's
PPOTrainer: an optional per-token KL penalty to the start policy (k1 = logp - logp_ref, times kl_coef) is added to
the rewards, GAE runs backwards with values 0 past the end, returns = advantages + values, advantages are whitened
over the batch's counted tokens, and the value loss is 0.5 * max((V - R)^2, (V_clipped - R)^2) with V_clipped
within cliprange_value of the value at sampling time.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.rl.grpo import aggregate

CRITICS = ("head", "detached")


def token_rewards(scores: np.ndarray, mask: np.ndarray, *, kl_coef: float = 0.0,
                  logprobs: np.ndarray | None = None, reference_logprobs: np.ndarray | None = None) -> np.ndarray:
    """[batch, len] rewards: `scores` (one per completion) at each completion's last counted token, minus
    kl_coef * (logprobs - reference_logprobs) at every counted token when kl_coef > 0; 0 where masked."""
    mask = np.asarray(mask, np.float64)
    rewards = np.zeros(mask.shape, np.float64)
    if kl_coef > 0:
        if logprobs is None or reference_logprobs is None:
            raise ValueError("kl_coef > 0 needs logprobs and reference_logprobs")
        rewards -= kl_coef * (np.asarray(logprobs, np.float64) - np.asarray(reference_logprobs, np.float64)) * mask
    lengths = mask.sum(axis=1).astype(int)
    rows = np.nonzero(lengths > 0)[0]
    rewards[rows, lengths[rows] - 1] += np.asarray(scores, np.float64)[rows]
    return rewards


def gae(rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, *, gamma: float,
        lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) by generalised advantage estimation over each row's counted tokens.

    delta_t = r_t + gamma * V_{t+1} - V_t with V = 0 past the last counted token; A_t = delta_t + gamma * lam *
    A_{t+1}; returns R_t = A_t + V_t. Both are 0 where masked."""
    mask = np.asarray(mask, np.float64)
    values = np.asarray(values, np.float64) * mask
    rewards = np.asarray(rewards, np.float64) * mask
    advantages = np.zeros_like(values)
    running = np.zeros(values.shape[0])
    for t in reversed(range(values.shape[1])):
        following = values[:, t + 1] if t + 1 < values.shape[1] else 0.0
        delta = rewards[:, t] + gamma * following - values[:, t]
        running = (delta + gamma * lam * running) * mask[:, t]
        advantages[:, t] = running
    return advantages, (advantages + values) * mask


def whiten(values: np.ndarray, mask: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """(x - mean) / std over the counted tokens (unbiased variance, as TRL's masked_whiten); 0 where masked."""
    mask = np.asarray(mask, np.float64)
    count = mask.sum()
    if count < 2:
        return np.zeros_like(values, dtype=np.float64)
    mean = (values * mask).sum() / count
    variance = (((values - mean) ** 2) * mask).sum() / (count - 1)
    return (values - mean) / np.sqrt(variance + eps) * mask


def init_value_head(hidden_size: int) -> dict:
    """A linear value head, zero-initialised: every value starts at 0 (the baseline of an untrained critic)."""
    return {"kernel": jnp.zeros((hidden_size,), jnp.float32), "bias": jnp.zeros((), jnp.float32)}


def value_head(head: dict, features: jax.Array, *, detached: bool) -> jax.Array:
    """Values [batch, len] from features [batch, len, hidden]; `detached` stops the gradient into the features
    (a critic on the policy's frozen representation that never moves the policy)."""
    if detached:
        features = jax.lax.stop_gradient(features)
    return features.astype(jnp.float32) @ head["kernel"] + head["bias"]


class ValueLoss(NamedTuple):
    """0.5 x the clipped squared error, and how often clipping chose the clipped term (masked means)."""

    loss: jax.Array
    clip_fraction: jax.Array


def value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array, *, clip: float,
               aggregation: str = "token_mean", normalizer: jax.Array | float | None = None) -> ValueLoss:
    """TRL's clipped value loss, reduced like the policy loss (vlmgym.rl.grpo.aggregate)."""
    mask = mask.astype(jnp.float32)
    old_values, returns = jax.lax.stop_gradient(old_values), jax.lax.stop_gradient(returns)
    clipped = old_values + jnp.clip(values - old_values, -clip, clip)
    unclipped_error, clipped_error = jnp.square(values - returns), jnp.square(clipped - returns)
    loss = 0.5 * aggregate(jnp.maximum(unclipped_error, clipped_error), mask, aggregation, normalizer)
    chose_clipped = (clipped_error > unclipped_error).astype(jnp.float32)
    return ValueLoss(loss, (chose_clipped * mask).sum() / jnp.maximum(mask.sum(), 1.0))


def explained_variance(values: np.ndarray, returns: np.ndarray, mask: np.ndarray) -> float:
    """1 - Var(R - V) / Var(R) over counted tokens: how much of the returns the critic predicts (1: all)."""
    active = np.asarray(mask) > 0
    r, v = np.asarray(returns)[active], np.asarray(values)[active]
    spread = r.var()
    return float(1.0 - (r - v).var() / spread) if spread > 0 else float("nan")


def check_critic(critic: Any) -> str:
    """A known critic name."""
    if critic not in CRITICS:
        raise ValueError(f"ppo.critic={critic!r}: expected one of {CRITICS}")
    return critic
