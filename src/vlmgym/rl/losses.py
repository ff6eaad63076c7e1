"""The losses and jitted gradient steps of every trainer (GRPO/RLOO, online DPO, SFT), apart from the loops that
call them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.models.qwen3_vl import lora
from vlmgym.rl import dpo, grpo
from vlmgym.rl.loop import (
    CompileCounter,
    Policy,
)
from vlmgym.rl.optim import Optimizer
from vlmgym.rl.sft import sft_loss_from_logprobs
from vlmgym.runtime import distributed


@dataclass(frozen=True)
class LossSettings:
    """Static settings of the jitted GRPO update (hashable)."""

    epsilon: float
    epsilon_high: float
    aggregation: str
    beta: float
    current_as_old: bool  # behaviour log-probs = this forward's own (stop-gradient) log-probs: ratio exactly 1
    importance_sampling_level: str = "token"  # token, sequence (GSPO), sequence_token
    sampler_correction: str = "none"  # none, or a grpo.SAMPLER_CORRECTIONS mode (micro["sampler"]: its log-probs)
    sampler_correction_cap: float = 3.0
    sampler_correction_floor: float = 0.0
    top_entropy_quantile: float = 1.0  # < 1: only that top share of tokens by entropy carry the policy loss


def _sampler_weights(behaviour: jax.Array, micro: dict, settings: LossSettings) -> tuple[jax.Array | None, dict]:
    """The sampler-correction weights (None when off) and their figures as sums over active tokens."""
    if settings.sampler_correction == "none":
        return None, {}
    mask = micro["mask"].astype(jnp.float32)
    weights = grpo.sampler_correction_weights(behaviour, micro["sampler"], mask, settings.sampler_correction,
                                              settings.sampler_correction_cap, settings.sampler_correction_floor)
    per_token = jnp.broadcast_to(weights, mask.shape)
    return weights, {"sampler_weight_mean": (per_token * mask).sum(),
                     "sampler_weight_zero": ((per_token == 0) * mask).sum()}


def _grpo_micro_loss(params: Any, micro: dict, normalizer: jax.Array, policy: Policy,
                     settings: LossSettings) -> tuple[jax.Array, dict]:
    if settings.top_entropy_quantile < 1.0:
        logprobs, entropies = policy.logprobs_and_entropies(params, micro["batch"])
        keep = grpo.high_entropy_mask(jax.lax.stop_gradient(entropies), micro["mask"], settings.top_entropy_quantile)
    else:
        logprobs, keep = policy.logprobs(params, micro["batch"]), None
    behaviour = jax.lax.stop_gradient(logprobs) if settings.current_as_old else micro["behaviour"]
    weights, weight_figures = _sampler_weights(behaviour, micro, settings)
    if keep is not None:
        weights = keep if weights is None else weights * keep
        weight_figures["entropy_kept"] = keep.sum()
    out = grpo.grpo_loss(logprobs, behaviour, micro["advantages"], micro["mask"], epsilon=settings.epsilon,
                         epsilon_high=settings.epsilon_high, aggregation=settings.aggregation, beta=settings.beta,
                         reference_logprobs=micro.get("reference"), normalizer=normalizer,
                         importance_sampling_level=settings.importance_sampling_level, token_weights=weights)
    tokens = micro["mask"].astype(jnp.float32).sum()
    # Per-micro-batch means become sums here and are divided by the batch's token count afterwards.
    aux = {"logprobs": jax.lax.stop_gradient(logprobs), "tokens": tokens, **weight_figures,
           "policy_loss": out.policy_loss, "kl_to_reference": out.kl_to_reference,
           "clip_fraction_low": out.clip_fraction_low * tokens, "clip_fraction_high": out.clip_fraction_high * tokens,
           "approx_kl_behaviour": out.approx_kl_behaviour * tokens, "ratio_mean": out.ratio_mean * tokens,
           "ratio_max": out.ratio_max, "ratio_min": out.ratio_min}
    return out.loss, aux


@partial(jax.jit, static_argnames=("policy", "optimizer", "settings", "compiles"))
def grpo_gradients(params: Any, micro: dict, normalizer: jax.Array, *, policy: Policy, optimizer: Optimizer,
                   settings: LossSettings, compiles: CompileCounter) -> tuple[jax.Array, Any, dict]:
    """GRPO loss, fp32 gradients and figures of one micro-batch (normalised by the whole batch's divisor)."""
    compiles.traced("grpo_gradients")
    return fp32_gradients(_grpo_micro_loss, params, micro, normalizer, optimizer, policy, settings)


def fp32_gradients(micro_loss: Callable, params: Any, micro: dict, normalizer: jax.Array, optimizer: Optimizer,
                    *args: Any) -> tuple[jax.Array, Any, dict]:
    """(loss, fp32 gradients, aux) of a micro-batch loss (frozen leaves get no gradient); traced inside a jit.

    The frozen leaves go behind stop_gradient inside the differentiated function, so the backward pass skips
    them and keeps none of the activations only they need (a frozen vision tower's)."""

    if optimizer.sparse:  # LoRA: differentiate only the trainable leaves; no gradient of the base exists at all
        def subset_loss(trained: list, micro: dict, *rest: Any) -> tuple[jax.Array, dict]:
            return micro_loss(lora.train_mode(optimizer.fill(params, trained), micro), micro, *rest)

        (loss, aux), grads = jax.value_and_grad(subset_loss, has_aux=True)(optimizer.select(params), micro,
                                                                            normalizer, *args)
        return loss, [g.astype(jnp.float32) for g in grads], aux

    def frozen_loss(p: Any, micro: dict, *rest: Any) -> tuple[jax.Array, dict]:
        return micro_loss(lora.train_mode(optimizer.stop_frozen_gradients(p), micro), micro, *rest)

    grad_fn = jax.value_and_grad(frozen_loss, has_aux=True)
    (loss, aux), grads = grad_fn(params, micro, normalizer, *args)
    return loss, jax.tree.map(lambda g: g.astype(jnp.float32), grads), aux


def _dpo_micro_loss(params: Any, micro: dict, normalizer: jax.Array, policy: Policy,
                    beta: float) -> tuple[jax.Array, dict]:
    logprobs = policy.logprobs(params, micro["batch"])
    out = dpo.dpo_loss(logprobs, micro["reference"], micro["mask"], micro["valid"], beta=beta, normalizer=normalizer)
    aux = {"logprobs": jax.lax.stop_gradient(logprobs), "dpo_margin": out.margin_sum,
           "dpo_accuracy": out.accuracy_sum, "dpo_chosen_reward": out.chosen_reward_sum,
           "dpo_rejected_reward": out.rejected_reward_sum}
    return out.loss, aux


@partial(jax.jit, static_argnames=("policy", "optimizer", "beta", "compiles"))
def dpo_gradients(params: Any, micro: dict, normalizer: jax.Array, *, policy: Policy, optimizer: Optimizer,
                  beta: float, compiles: CompileCounter) -> tuple[jax.Array, Any, dict]:
    """Online DPO loss, fp32 gradients and figure sums of one micro-batch of pair rows."""
    compiles.traced("dpo_gradients")
    return fp32_gradients(_dpo_micro_loss, params, micro, normalizer, optimizer, policy, beta)


@partial(jax.jit, static_argnames=("policy", "compiles"))
def train_logprobs(params: Any, micro: dict, *, policy: Policy, compiles: CompileCounter) -> jax.Array:
    """The per-token log-probs of a micro-batch's rows as its training forward sees them (its LoRA dropout, if any),
    without a gradient: what online DPO over episodes weighs its rows by before the update."""
    compiles.traced("train_logprobs")
    return policy.logprobs(lora.train_mode(params, micro), micro["batch"])


def _weighted_micro_loss(params: Any, micro: dict, normalizer: jax.Array, policy: Policy) -> tuple[jax.Array, dict]:
    logprobs = policy.logprobs(params, micro["batch"])
    sums = (logprobs.astype(jnp.float32) * micro["mask"].astype(jnp.float32)).sum(axis=-1)
    return (micro["coefficients"] * sums).sum() / normalizer, {"logprobs": jax.lax.stop_gradient(logprobs)}


@partial(jax.jit, static_argnames=("policy", "optimizer", "compiles"))
def weighted_logprob_gradients(params: Any, micro: dict, normalizer: jax.Array, *, policy: Policy,
                               optimizer: Optimizer, compiles: CompileCounter) -> tuple[jax.Array, Any, dict]:
    """fp32 gradients of sum over rows of coefficient x summed log-probs (micro["coefficients"] [rows], constants):
    a loss of whole-sequence log-probs that spans micro-batches, by the chain rule (vlmgym.rl.dpo.pair_terms)."""
    compiles.traced("weighted_logprob_gradients")
    return fp32_gradients(_weighted_micro_loss, params, micro, normalizer, optimizer, policy)


def combine_dpo_figures(auxes: list[dict], pairs: int) -> dict[str, float]:
    auxes = _scalar_figures(auxes)
    out = {"loss": sum(float(a["loss"]) for a in auxes)}
    for name in ("dpo_margin", "dpo_accuracy", "dpo_chosen_reward", "dpo_rejected_reward"):
        out[name] = sum(float(a[name]) for a in auxes) / max(pairs, 1)
    return out


@partial(jax.jit, donate_argnums=0)
def _add(total: Any, more: Any) -> Any:
    return jax.tree.map(jnp.add, total, more)


@partial(jax.jit, static_argnames=("optimizer", "compiles"), donate_argnums=(0, 1))
def apply_update(params: Any, opt_state: Any, grads: Any, *, optimizer: Optimizer,
                 compiles: CompileCounter) -> tuple[Any, Any, dict]:
    """One optimizer step with the summed gradients (params and state buffers are donated)."""
    compiles.traced("apply_update")
    return optimizer.update(grads, opt_state, params)


def accumulate(gradient_fn: Callable, micro_batches: list) -> tuple[Any, list]:
    """Sum a jitted (loss, grads, aux) function's gradients over micro-batches; returns grads and each aux."""
    total, auxes = None, []
    for micro in micro_batches:
        loss, grads, aux = gradient_fn(micro)
        total = grads if total is None else _add(total, grads)
        auxes.append({"loss": loss, **aux})
    return total, auxes


def _scalar_figures(auxes: list[dict]) -> list[dict]:
    """The per-micro-batch figures on the host, without the per-token log-probs (rows spread over processes)."""
    return jax.device_get([{name: value for name, value in aux.items() if name != "logprobs"} for aux in auxes])


def first_learner_logprobs(auxes: list[dict]) -> np.ndarray:
    """The first learner forward's per-token log-probs of every row, on this host."""
    return np.concatenate([distributed.host_value(aux["logprobs"]) for aux in auxes])


def combine_grpo_figures(auxes: list[dict]) -> dict[str, float]:
    """Whole-batch figures from per-micro-batch sums (host side)."""
    auxes = _scalar_figures(auxes)
    tokens = max(sum(float(a["tokens"]) for a in auxes), 1.0)
    out = {name: sum(float(a[name]) for a in auxes) for name in ("loss", "policy_loss", "kl_to_reference")}
    for name in ("clip_fraction_low", "clip_fraction_high", "approx_kl_behaviour", "ratio_mean", "sampler_weight_mean",
                 "sampler_weight_zero", "entropy_kept"):
        if name in auxes[0]:
            out[name] = sum(float(a[name]) for a in auxes) / tokens
    out["ratio_max"] = max(float(a["ratio_max"]) for a in auxes)
    out["ratio_min"] = min(float(a["ratio_min"]) for a in auxes)
    return out


@partial(jax.jit, static_argnames=("policy", "compiles"))
def policy_logprobs(params: Any, batch: Any, *, policy: Policy, compiles: CompileCounter) -> jax.Array:
    """The policy's log-probs of a batch (the frozen reference's, when beta > 0)."""
    compiles.traced("policy_logprobs")
    return policy.logprobs(params, batch)


@partial(jax.jit, static_argnames=("group_size", "scale_rewards", "leave_one_out"))
def group_advantages(rewards: jax.Array, group_size: int, scale_rewards: str, leave_one_out: bool = False) -> jax.Array:
    return grpo.group_advantages(rewards, group_size, scale_rewards, leave_one_out=leave_one_out)


@jax.jit
def behaviour_statistics(learner_logprobs: jax.Array, sampler_logprobs: jax.Array, mask: jax.Array) -> dict:
    """Sampler-vs-learner mismatch and the entropy estimate, from the first (pre-update) learner forward."""
    return {**grpo.logprob_mismatch(learner_logprobs, sampler_logprobs, mask),
            "entropy": grpo.entropy_from_logprobs(learner_logprobs, mask)}


def _sft_micro_loss(params: Any, micro: dict, normalizer: jax.Array, policy: Policy) -> tuple[jax.Array, dict]:
    logprobs = policy.logprobs(params, micro["batch"])
    mask = micro["mask"].astype(jnp.float32)
    return sft_loss_from_logprobs(logprobs, mask, normalizer), {"tokens": mask.sum()}


@partial(jax.jit, static_argnames=("policy", "optimizer", "compiles"))
def sft_gradients(params: Any, micro: dict, normalizer: jax.Array, *, policy: Policy, optimizer: Optimizer,
                  compiles: CompileCounter) -> tuple[jax.Array, Any, dict]:
    """SFT loss and fp32 gradients of one micro-batch (normalised by the whole batch's token count)."""
    compiles.traced("sft_gradients")
    return fp32_gradients(_sft_micro_loss, params, micro, normalizer, optimizer, policy)
