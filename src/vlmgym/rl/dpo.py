"""Online DPO: a preference pair from each sampled group (its best and worst answer by reward) and the DPO loss.

As in TRL's OnlineDPOTrainer (sigmoid loss): per pair, with sequence log-probs summed over the completion tokens,

    logit = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected))
    loss  = -log sigmoid(beta * logit)

averaged over the valid pairs; the reference is the policy training started from. A group whose rewards are all
equal has no preference and gives no pair (a tie: its pair is kept for a fixed batch shape, with weight 0).
Pair rows are laid out chosen, rejected, chosen, rejected, ...: pair p is rows 2p and 2p + 1.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Pairs(NamedTuple):
    """One pair per group: row indices (into the group-contiguous batch) and whether the group had a preference."""

    chosen: np.ndarray  # int, [groups]
    rejected: np.ndarray  # int, [groups]
    valid: np.ndarray  # bool, [groups]: the chosen answer's reward is strictly higher


def select_pairs(rewards: np.ndarray, group_size: int) -> Pairs:
    """Each group's highest- and lowest-reward answers (the first of equals); ties are marked invalid."""
    rewards = np.asarray(rewards, np.float64)
    if rewards.ndim != 1 or len(rewards) % group_size:
        raise ValueError(f"rewards of shape {rewards.shape} is not a flat batch of whole groups of {group_size}")
    grouped = rewards.reshape(-1, group_size)
    offsets = np.arange(len(grouped)) * group_size
    best, worst = grouped.argmax(axis=1), grouped.argmin(axis=1)
    valid = grouped.max(axis=1) > grouped.min(axis=1)
    return Pairs(offsets + best, offsets + worst, valid)


def pair_rows(pairs: Pairs) -> np.ndarray:
    """The batch rows of the pairs, interleaved chosen, rejected (2 x groups)."""
    return np.stack([pairs.chosen, pairs.rejected], axis=1).reshape(-1)


class DPOOutput(NamedTuple):
    """The loss (to minimise) and its figures; figures are sums over valid pairs (divide by their count)."""

    loss: jax.Array
    margin_sum: jax.Array  # beta * logit
    accuracy_sum: jax.Array  # the policy prefers the chosen answer more than the reference does (logit > 0)
    chosen_reward_sum: jax.Array  # beta * (log pi - log ref) of the chosen answer
    rejected_reward_sum: jax.Array


def dpo_loss(logprobs: jax.Array, reference_logprobs: jax.Array, mask: jax.Array, valid: jax.Array, *,
             beta: float, normalizer: jax.Array | float | None = None) -> DPOOutput:
    """DPO loss over pair rows [2 x pairs, len] (chosen, rejected interleaved) with per-token log-probs of the
    policy and the reference; `valid` [pairs] weighs each pair 1 or 0; `normalizer` replaces the valid-pair
    count (the whole batch's, under gradient accumulation)."""
    mask = mask.astype(jnp.float32)
    policy = (logprobs.astype(jnp.float32) * mask).sum(axis=-1).reshape(-1, 2)
    reference = (reference_logprobs.astype(jnp.float32) * mask).sum(axis=-1).reshape(-1, 2)
    ratios = policy - reference  # [pairs, (chosen, rejected)]
    logit = ratios[:, 0] - ratios[:, 1]
    weight = valid.astype(jnp.float32)
    if normalizer is None:
        normalizer = jnp.maximum(weight.sum(), 1.0)
    loss = (-jax.nn.log_sigmoid(beta * logit) * weight).sum() / normalizer
    return DPOOutput(loss=loss, margin_sum=(beta * logit * weight).sum(),
                     accuracy_sum=((logit > 0) * weight).sum(),
                     chosen_reward_sum=(beta * ratios[:, 0] * weight).sum(),
                     rejected_reward_sum=(beta * ratios[:, 1] * weight).sum())


class PairTerms(NamedTuple):
    """DPO over pairs whose sides span several rows (a multi-turn episode: one row per policy turn): the loss, each
    row's coefficient (d loss / d its summed log-probs) and the figures as sums over valid pairs."""

    loss: float
    coefficients: np.ndarray  # [rows]
    margin_sum: float
    accuracy_sum: float
    chosen_reward_sum: float
    rejected_reward_sum: float


def pair_terms(policy_sums: np.ndarray, reference_sums: np.ndarray, pair: np.ndarray, sign: np.ndarray,
               valid: np.ndarray, *, beta: float, normalizer: float) -> PairTerms:
    """dpo_loss with a side's sequence log-prob the sum of its rows' (a trajectory's log-probability is the sum of
    its turns'). `policy_sums` / `reference_sums` [rows] are each row's summed log-probs, `pair` [rows] its pair,
    `sign` [rows] +1 for the chosen side's rows and -1 for the rejected's, `valid` [pairs] weighs each pair 1 or 0.

    The loss does not split over micro-batches of rows, but its gradient does: sum over rows of coefficient x the
    gradient of the row's summed log-probs, with the coefficients taken at the current policy (one forward first).
    """
    ratios = np.asarray(policy_sums, np.float64) - np.asarray(reference_sums, np.float64)
    pairs = len(valid)
    chosen = np.bincount(pair, weights=ratios * (sign > 0), minlength=pairs)
    rejected = np.bincount(pair, weights=ratios * (sign < 0), minlength=pairs)
    logit = chosen - rejected
    weight = np.asarray(valid, np.float64)
    # -log sigmoid(x) = log(1 + e^-x), and its derivative -sigmoid(-x), written to stay finite for large |x|
    loss = float((np.logaddexp(0.0, -beta * logit) * weight).sum() / normalizer)
    slope = -beta * np.exp(-np.logaddexp(0.0, beta * logit)) * weight / normalizer  # d loss / d logit
    return PairTerms(loss=loss, coefficients=(slope[pair] * sign).astype(np.float32),
                     margin_sum=float((beta * logit * weight).sum()), accuracy_sum=float(((logit > 0) * weight).sum()),
                     chosen_reward_sum=float((beta * chosen * weight).sum()),
                     rejected_reward_sum=float((beta * rejected * weight).sum()))
