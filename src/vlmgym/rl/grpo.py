"""GRPO as pure functions: the clipped surrogate, loss aggregation, KL, metrics.

Conventions used throughout:
- A batch holds `num_groups * group_size` sequences, group-contiguous: sequences
  `[g * group_size, (g + 1) * group_size)` answer the same prompt.
- Per-token arrays are `[batch, completion_len]` and aligned with the completion tokens;
  `mask` is 1.0 on tokens that count (the completion up to and including its first EOS)
  and 0.0 elsewhere. Every reduction here is masked, so post-EOS and padding tokens
  never contribute to a loss, a gradient or a metric.
- `behaviour_logprobs` are the log-probabilities the sampler assigned to the sampled tokens
  under the full softmax of the tempered logits (sampling temperature; no top-k/top-p filter), the same
  distribution the learner scores, so that on-policy the ratio is 1.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

SCALE_REWARDS = ("group", "batch", "none")
LOSS_AGGREGATIONS = ("token_mean", "sequence_mean", "dr_grpo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")
SAMPLER_CORRECTIONS = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def mask_after_eos(tokens: jax.Array, eos_ids: tuple[int, ...] | list[int],
                   valid: jax.Array | None = None) -> jax.Array:
    """1.0 on completion tokens up to and including the first EOS, 0.0 after it (and where `valid` is 0)."""
    tokens = jnp.asarray(tokens)
    is_eos = jnp.isin(tokens, jnp.asarray(list(eos_ids), dtype=tokens.dtype))
    # Number of EOS tokens strictly before each position: positions after the first EOS have >= 1.
    eos_before = jnp.cumsum(is_eos, axis=-1) - is_eos
    mask = (eos_before == 0).astype(jnp.float32)
    if valid is not None:
        mask = mask * jnp.asarray(valid, jnp.float32)
    return mask


def group_reward_std(rewards: jax.Array | np.ndarray, group_size: int) -> np.ndarray:
    """Population std of the rewards of each group, shape [num_groups]."""
    return np.asarray(rewards, np.float64).reshape(-1, group_size).std(axis=1)


class GroupFilter(NamedTuple):
    """Which groups carry a learning signal, and how many did not."""

    keep: np.ndarray  # [num_groups] bool
    num_kept: int
    num_dropped: int


def filter_groups(rewards: jax.Array | np.ndarray, group_size: int, min_std: float = 0.0) -> GroupFilter:
    """Mark groups whose rewards are all equal (std <= min_std) for dropping: their advantages are all 0."""
    std = group_reward_std(rewards, group_size)
    # A tiny relative tolerance so rewards equal up to float noise count as equal.
    keep = std > max(min_std, 1e-9)
    return GroupFilter(keep=keep, num_kept=int(keep.sum()), num_dropped=int((~keep).sum()))


def truncated_rows(tokens: np.ndarray, mask: np.ndarray, eos_ids: tuple[int, ...] | list[int]) -> np.ndarray:
    """[batch] bool: answers that reached the length budget without an EOS (rows with no active token are not)."""
    tokens, mask = np.asarray(tokens), np.asarray(mask) > 0
    return mask.any(axis=1) & ~(np.isin(tokens, list(eos_ids)) & mask).any(axis=1)


def soft_overlong_penalty(lengths: np.ndarray, max_length: int, buffer: int, factor: float = 1.0) -> np.ndarray:
    """DAPO's soft overlong punishment (its eq. 13; TRL's get_soft_overlong_punishment), times `factor`: 0 up to
    max_length - buffer tokens, then falling linearly to -1 at max_length, -1 beyond. With buffer 0 nothing the
    sampler can return (at most max_length tokens) is penalised."""
    lengths = np.asarray(lengths, np.float64)
    start = max_length - buffer
    penalty = np.where(lengths <= start, 0.0,
                       np.where(lengths <= max_length, (start - lengths) / max(buffer, 1), -1.0))
    return factor * penalty


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str = "token_mean",
              normalizer: jax.Array | float | None = None) -> jax.Array:
    """Reduce a [batch, len] per-token quantity to a scalar.

    token_mean: sum over active tokens / number of active tokens of the batch (the default; long answers
    weigh more). sequence_mean: each sequence's token mean, averaged over sequences that have at least one
    active token (plain GRPO). dr_grpo: sum over active tokens / (batch * max_len), a constant divisor.
    `normalizer` overrides the divisor: with gradient accumulation the trainer passes the whole batch's
    divisor (active tokens, active sequences, or batch * max_len) to every micro-batch so the summed
    micro-batch losses equal the full-batch loss exactly.
    """
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss aggregation {mode!r}: expected one of {LOSS_AGGREGATIONS}")
    mask = mask.astype(per_token.dtype)
    if mode == "sequence_mean":
        tokens_per_sequence = mask.sum(axis=-1)
        per_sequence = (per_token * mask).sum(axis=-1) / jnp.maximum(tokens_per_sequence, 1.0)
        divisor = (tokens_per_sequence > 0).sum() if normalizer is None else normalizer
        return per_sequence.sum() / jnp.maximum(divisor, 1.0)
    total = (per_token * mask).sum()
    if normalizer is not None:
        divisor = normalizer
    elif mode == "token_mean":
        divisor = mask.sum()
    else:
        divisor = per_token.shape[0] * per_token.shape[1]
    return total / jnp.maximum(divisor, 1.0)


def aggregation_normalizer(mask: jax.Array | np.ndarray, mode: str) -> float:
    """The full-batch divisor `aggregate` uses, to pass to each micro-batch under gradient accumulation."""
    mask = np.asarray(mask)
    if mode == "token_mean":
        return float(max(mask.sum(), 1.0))
    if mode == "sequence_mean":
        return float(max((mask.sum(axis=-1) > 0).sum(), 1))
    if mode == "dr_grpo":
        return float(mask.shape[0] * mask.shape[1])
    raise ValueError(f"loss aggregation {mode!r}: expected one of {LOSS_AGGREGATIONS}")


def k3_kl(logprobs: jax.Array, other_logprobs: jax.Array) -> jax.Array:
    """Per-token k3 estimate of KL(p || q) from samples of p: exp(q - p) - (q - p) - 1 (>= 0, unbiased)."""
    log_ratio = other_logprobs - logprobs
    return jnp.exp(log_ratio) - log_ratio - 1.0


class LossOutput(NamedTuple):
    """The scalar loss and the per-batch figures that explain it (all masked means over active tokens)."""

    loss: jax.Array
    policy_loss: jax.Array
    kl_to_reference: jax.Array
    clip_fraction_low: jax.Array
    clip_fraction_high: jax.Array
    approx_kl_behaviour: jax.Array
    ratio_mean: jax.Array
    ratio_max: jax.Array
    ratio_min: jax.Array


def sequence_mean_log_ratio(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
    """Each sequence's mean per-token log-ratio over its active tokens [batch, 1] (GSPO's log s_i)."""
    return ((log_ratio * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0))[:, None]


def importance_log_weights(logprobs: jax.Array, behaviour_logprobs: jax.Array, mask: jax.Array,
                           level: str = "token") -> jax.Array:
    """The log importance ratio the surrogate clips, [batch, len] (token, sequence_token) or [batch, 1] (sequence).

    token: log pi(y_t) - log pi_old(y_t) (PPO, GRPO). sequence (GSPO): the sequence's length-normalised log-ratio,
    one ratio per answer. sequence_token (GSPO-token): that sequence ratio held fixed, times pi(y_t) / sg[pi(y_t)],
    so its value is the sequence ratio and each token keeps its own gradient (TRL's importance_sampling_level)."""
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"importance_sampling_level={level!r}: expected one of {IMPORTANCE_SAMPLING_LEVELS}")
    log_ratio = logprobs - jax.lax.stop_gradient(behaviour_logprobs)
    if level == "token":
        return log_ratio
    sequence = sequence_mean_log_ratio(log_ratio, mask)
    if level == "sequence":
        return sequence
    return logprobs - jax.lax.stop_gradient(logprobs) + jax.lax.stop_gradient(sequence)


def sampler_correction_weights(old_logprobs: jax.Array, sampler_logprobs: jax.Array, mask: jax.Array, mode: str,
                               cap: float, floor: float = 0.0) -> jax.Array:
    """Importance weights old / sampler for the mismatch between the sampler and the learner's recomputation at
    sampling time, truncated or masked to [floor, cap]: [batch, len] for token modes, [batch, 1] for sequence modes
    (the summed log-ratio of the sequence). `*_truncate` clips into the range (TIS); `*_mask` zeroes what falls
    outside it (MIS). TRL's vllm_importance_sampling_mode; floor 0 is TRL's clip_min None."""
    if mode not in SAMPLER_CORRECTIONS[1:]:
        raise ValueError(f"sampler correction {mode!r}: expected one of {SAMPLER_CORRECTIONS[1:]}")
    diff = (jax.lax.stop_gradient(old_logprobs) - sampler_logprobs) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdims=True)
    ratio = jnp.exp(diff)
    if mode.endswith("truncate"):
        return jnp.clip(ratio, floor, cap)
    return jnp.where((ratio < floor) | (ratio > cap), 0.0, ratio)


def high_entropy_mask(entropies: jax.Array, mask: jax.Array, quantile: float) -> jax.Array:
    """1.0 on the active tokens whose entropy is at or above the (1 - quantile) quantile of the active tokens'
    entropies (linear interpolation, as torch.quantile), 0.0 elsewhere: only the top `quantile` share of tokens by
    entropy carry the policy loss (TRL's top_entropy_quantile; 1 keeps every token, 0 the highest only)."""
    active = mask > 0
    values = jnp.where(active, entropies.astype(jnp.float32), jnp.nan)
    threshold = jnp.nanquantile(values, 1.0 - quantile)
    return (active & (entropies >= threshold)).astype(jnp.float32)


def grpo_loss(logprobs: jax.Array, behaviour_logprobs: jax.Array, advantages: jax.Array, mask: jax.Array, *,
              epsilon: float = 0.2, epsilon_high: float | None = None, aggregation: str = "token_mean",
              beta: float = 0.0, reference_logprobs: jax.Array | None = None,
              normalizer: jax.Array | float | None = None, importance_sampling_level: str = "token",
              token_weights: jax.Array | None = None) -> LossOutput:
    """Clipped-surrogate GRPO loss (to minimise) with clip-higher and an optional k3 KL to a reference.

    logprobs: learner log-probs of the sampled tokens [batch, len] (differentiated);
    behaviour_logprobs: the policy that sampled them (tempered softmax), held fixed;
    advantages: one per sequence [batch] (GRPO), or one per token [batch, len] (PPO's GAE);
    epsilon / epsilon_high: the ratio is clipped to [1 - epsilon, 1 + epsilon_high] (epsilon_high None:
    symmetric); beta > 0 needs reference_logprobs;
    importance_sampling_level: token, sequence (GSPO) or sequence_token (`importance_log_weights`);
    token_weights: multiplies each token's policy term (the sampler correction, the entropy mask), held fixed.
    """
    if beta > 0.0 and reference_logprobs is None:
        raise ValueError("beta > 0 needs reference_logprobs (the frozen reference policy's log-probs)")
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    mask = mask.astype(jnp.float32)
    log_ratio = importance_log_weights(logprobs, behaviour_logprobs, mask, importance_sampling_level)
    ratio = jnp.broadcast_to(jnp.exp(log_ratio), logprobs.shape)
    token_advantages = (advantages if advantages.ndim == 2 else advantages[:, None]).astype(ratio.dtype)
    unclipped = ratio * token_advantages
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon_high) * token_advantages
    per_token = -jnp.minimum(unclipped, clipped)
    if token_weights is not None:
        per_token = per_token * jax.lax.stop_gradient(token_weights)
    policy_loss = aggregate(per_token, mask, aggregation, normalizer)

    kl_to_reference = jnp.zeros((), jnp.float32)
    loss = policy_loss
    if reference_logprobs is not None:
        kl_per_token = k3_kl(logprobs, jax.lax.stop_gradient(reference_logprobs))
        kl_to_reference = aggregate(kl_per_token, mask, aggregation, normalizer)
        loss = loss + beta * kl_to_reference

    # Clip fractions count only the tokens where clipping removes the gradient: ratio below the low bound
    # with a negative advantage, or above the high bound with a positive one.
    ratio_sg = jax.lax.stop_gradient(ratio)
    low = ((ratio_sg < 1.0 - epsilon) & (token_advantages < 0)).astype(jnp.float32)
    high = ((ratio_sg > 1.0 + epsilon_high) & (token_advantages > 0)).astype(jnp.float32)
    # k3 estimate of KL(behaviour || learner) from behaviour samples: r - 1 - log r, r = learner / behaviour per
    # token (whatever ratio the surrogate clips).
    if importance_sampling_level == "token":
        approx_kl = ratio_sg - 1.0 - jax.lax.stop_gradient(log_ratio)
    else:
        token_log_ratio = jax.lax.stop_gradient(logprobs - behaviour_logprobs)
        approx_kl = jnp.exp(token_log_ratio) - 1.0 - token_log_ratio
    big = jnp.finfo(jnp.float32).max
    return LossOutput(
        loss=loss,
        policy_loss=policy_loss,
        kl_to_reference=kl_to_reference,
        clip_fraction_low=masked_mean(low, mask),
        clip_fraction_high=masked_mean(high, mask),
        approx_kl_behaviour=masked_mean(approx_kl, mask),
        ratio_mean=masked_mean(ratio_sg, mask),
        ratio_max=jnp.max(jnp.where(mask > 0, ratio_sg, -big)),
        ratio_min=jnp.min(jnp.where(mask > 0, ratio_sg, big)),
    )


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of `values` over positions where mask is 1 (0 when nothing is active)."""
    mask = mask.astype(jnp.float32)
    return (values * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def entropy_from_logits(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """Exact mean per-token entropy of the plain softmax over the vocabulary, over active tokens."""
    log_p = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    per_token = -(jnp.exp(log_p) * log_p).sum(axis=-1)
    return masked_mean(per_token, mask)


def entropy_from_logprobs(sampled_logprobs: jax.Array, mask: jax.Array) -> jax.Array:
    """Monte-Carlo entropy estimate: mean of -log p(sampled token) over active tokens.

    Unbiased for the policy's entropy when tokens were sampled from that same plain softmax; with a
    sampling temperature or top-k/top-p it is the cross-entropy of the sampler against the policy
    (what the trainer logs as `entropy` when the learner forward returns no logits).
    """
    return masked_mean(-sampled_logprobs.astype(jnp.float32), mask)


def logprob_mismatch(learner_logprobs: jax.Array, sampler_logprobs: jax.Array, mask: jax.Array) -> dict:
    """How far the sampler's log-probs are from the learner's recomputation of the same tokens."""
    diff = jnp.abs(learner_logprobs - sampler_logprobs)
    return {
        "logprob_mismatch_mean": masked_mean(diff, mask),
        "logprob_mismatch_max": jnp.max(jnp.where(mask > 0, diff, 0.0)),
        "kl_sampler_learner": masked_mean(k3_kl(sampler_logprobs, learner_logprobs), mask),
    }
