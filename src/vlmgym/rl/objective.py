"""An RL step, part 2: the GRPO/RLOO objective, stated once. To change the GRPO loss, edit this module.

Its settings are the params section train.objective (vlmgym.params.ObjectiveParams), which the jitted step takes
whole as a static argument; `group_advantages` scores each answer against its group, `micro_loss` is the loss of one
micro-batch (what TRL's GRPOTrainer calls `_compute_loss`), and the figure tables say how each of the loss's figures
combines over micro-batches and iterations. The clipped surrogate's per-token arithmetic is
vlmgym.rl.grpo.grpo_loss (PPO's policy loss too); sampling is vlmgym.rl.sampling, the jitted gradient and optimizer
step vlmgym.rl.update.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.params import ObjectiveParams, TrainParams
from vlmgym.rl import grpo
from vlmgym.rl.loop import Policy
from vlmgym.rl.trainer_parts import scalar_figures

# The loss's figures, by how a step combines them. Each micro-batch reports sums: the SUMMED ones are divided by the
# whole batch's normaliser already (their sum over micro-batches is the batch's), the TOKEN_MEANS are means times
# the micro-batch's token count (divided by the batch's tokens afterwards), the OPTIONAL_TOKEN_MEANS the same when a
# setting turns them on, and the ratio's extremes are the extremes over micro-batches.
SUMMED = ("loss", "policy_loss", "kl_to_reference")
TOKEN_MEANS = ("clip_fraction_low", "clip_fraction_high", "approx_kl_behaviour", "ratio_mean")
OPTIONAL_TOKEN_MEANS = ("sampler_weight_mean", "sampler_weight_zero", "entropy_kept")
# Over num_iterations updates these say most after the last one (the first is on-policy); the rest are averaged.
LAST_ITERATION = ("clip_fraction_low", "clip_fraction_high", "approx_kl_behaviour", "ratio_mean", "ratio_max",
                  "ratio_min")


@partial(jax.jit, static_argnames=("group_size", "scale_rewards", "eps", "leave_one_out"))
def group_advantages(rewards: jax.Array, group_size: int, scale_rewards: str = "group",
                     eps: float = 1e-4, leave_one_out: bool = False) -> jax.Array:
    """Advantage of each sequence: its reward minus its group's mean, optionally divided by a std.

    leave_one_out (RLOO): the baseline is the mean of the *other* answers of the group, so it does not depend on
    the answer it scores: r_i - (sum - r_i) / (G - 1) = G / (G - 1) x (r_i - mean), the GRPO centring scaled up
    (0 for a group of one). Any std division applies after it.
    scale_rewards: "group" divides by the std of the sequence's own group, "batch" by the std of all
    rewards in the batch, "none" does not divide (Dr. GRPO). Stds are population stds (ddof=0): they are
    defined for any group size (a group of one gets advantage 0 instead of a division by zero) and a
    two-sample group with rewards {0, 1} gets advantages of exactly -1 and +1. `eps` keeps groups whose
    rewards are all equal at advantage 0 rather than 0/0.
    """
    if scale_rewards not in grpo.SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale_rewards!r}: expected one of {grpo.SCALE_REWARDS}")
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards of shape {rewards.shape} is not a flat batch of whole groups of {group_size}")
    grouped = rewards.reshape(-1, group_size)
    centred = grouped - grouped.mean(axis=1, keepdims=True)
    if leave_one_out:
        centred = centred * (group_size / (group_size - 1)) if group_size > 1 else centred * 0
    if scale_rewards == "group":
        centred = centred / (grouped.std(axis=1, keepdims=True) + eps)
    elif scale_rewards == "batch":
        centred = centred / (rewards.std() + eps)
    return centred.reshape(-1)


def micro_loss(params: Any, micro: dict, normalizer: jax.Array, policy: Policy, objective: ObjectiveParams,
               current_as_old: bool = False) -> tuple[jax.Array, dict]:
    """The GRPO loss of one micro-batch (normalised by the whole batch's divisor) and its figures as sums.

    micro: "batch" (the learner's input), "mask" [rows, len] (the tokens that carry the loss), "advantages" [rows],
    "behaviour" [rows, len] (the log-probs the ratio is taken against), and "sampler" (the sampler's log-probs, with
    a sampler correction) and "reference" (the start policy's, with beta > 0).
    current_as_old: the behaviour log-probs are this forward's own (stop-gradient) instead of micro["behaviour"], so
    every ratio is exactly 1 (the first update with train.old_logprobs: learner, whose forward is the recomputation).
    """
    if objective.top_entropy_quantile < 1.0:
        logprobs, entropies = policy.logprobs_and_entropies(params, micro["batch"])
        keep = grpo.high_entropy_mask(jax.lax.stop_gradient(entropies), micro["mask"],
                                      objective.top_entropy_quantile)
    else:
        logprobs, keep = policy.logprobs(params, micro["batch"]), None
    behaviour = jax.lax.stop_gradient(logprobs) if current_as_old else micro["behaviour"]
    weights, weight_figures = _sampler_weights(behaviour, micro, objective)
    if keep is not None:
        weights = keep if weights is None else weights * keep
        weight_figures["entropy_kept"] = keep.sum()
    out = grpo.grpo_loss(logprobs, behaviour, micro["advantages"], micro["mask"], epsilon=objective.epsilon,
                         epsilon_high=objective.epsilon_high, aggregation=objective.loss_aggregation,
                         beta=objective.beta, reference_logprobs=micro.get("reference"), normalizer=normalizer,
                         importance_sampling_level=objective.importance_sampling_level, token_weights=weights)
    tokens = micro["mask"].astype(jnp.float32).sum()
    return out.loss, {"logprobs": jax.lax.stop_gradient(logprobs), "tokens": tokens, **weight_figures,
                      **loss_figures(out, tokens)}


def _sampler_weights(behaviour: jax.Array, micro: dict, objective: ObjectiveParams) -> tuple[jax.Array | None, dict]:
    """The sampler-correction weights (None when off) and their figures as sums over active tokens."""
    if objective.sampler_correction == "none":
        return None, {}
    mask = micro["mask"].astype(jnp.float32)
    weights = grpo.sampler_correction_weights(behaviour, micro["sampler"], mask, objective.sampler_correction,
                                              objective.sampler_correction_cap, objective.sampler_correction_floor)
    per_token = jnp.broadcast_to(weights, mask.shape)
    return weights, {"sampler_weight_mean": (per_token * mask).sum(),
                     "sampler_weight_zero": ((per_token == 0) * mask).sum()}


def loss_figures(out: grpo.LossOutput, tokens: jax.Array) -> dict:
    """A micro-batch's figures of the clipped surrogate (traced), as `combine_figures` adds them up."""
    return {"policy_loss": out.policy_loss, "kl_to_reference": out.kl_to_reference,
            **{name: getattr(out, name) * tokens for name in TOKEN_MEANS},
            "ratio_max": out.ratio_max, "ratio_min": out.ratio_min}


def combine_figures(auxes: list[dict], with_kl: bool) -> dict[str, float]:
    """One update's figures from its micro-batches' (host side); kl_to_reference only `with_kl` (a loss with a KL
    term: the figure is 0 otherwise)."""
    auxes = scalar_figures(auxes)
    tokens = max(sum(float(a["tokens"]) for a in auxes), 1.0)
    out = {name: sum(float(a[name]) for a in auxes) for name in SUMMED}
    for name in TOKEN_MEANS + OPTIONAL_TOKEN_MEANS:
        if name in auxes[0]:
            out[name] = sum(float(a[name]) for a in auxes) / tokens
    out["ratio_max"] = max(float(a["ratio_max"]) for a in auxes)
    out["ratio_min"] = min(float(a["ratio_min"]) for a in auxes)
    if not with_kl:
        del out["kl_to_reference"]
    return out


def step_advantages(rewards: np.ndarray, real: np.ndarray, c: TrainParams) -> np.ndarray:
    """Each row's advantage (GRPO's group baseline, RLOO's leave-one-out one); a padding group's rows get 0 (their
    mask is 0 too)."""
    advantages = np.zeros(len(rewards), np.float32)
    advantages[real] = np.asarray(group_advantages(rewards[real], c.group_size, c.objective.scale_rewards,
                                                   leave_one_out=c.algorithm == "rloo"))
    return advantages
