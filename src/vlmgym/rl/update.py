"""An RL step, part 3: the update. Every trainer's jitted gradient step over one micro-batch (GRPO/RLOO's of the loss
in vlmgym.rl.objective; online DPO's and SFT's of the losses below), the gradients summed over micro-batches, and
the optimizer step."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.models.qwen3_vl import lora
from vlmgym.params import ObjectiveParams
from vlmgym.rl import dpo, grpo
from vlmgym.rl.loop import CompileCounter, Policy
from vlmgym.rl.objective import micro_loss
from vlmgym.rl.optim import Optimizer
from vlmgym.rl.sft import sft_loss_from_logprobs
from vlmgym.runtime import distributed


@partial(jax.jit, static_argnames=("policy", "optimizer", "objective", "compiles", "current_as_old"))
def grpo_gradients(params: Any, micro: dict, normalizer: jax.Array, *, policy: Policy, optimizer: Optimizer,
                   objective: ObjectiveParams, compiles: CompileCounter,
                   current_as_old: bool = False) -> tuple[jax.Array, Any, dict]:
    """GRPO loss (vlmgym.rl.objective.micro_loss, with train.objective's settings and its current_as_old), fp32
    gradients and figures of one micro-batch (normalised by the whole batch's divisor)."""
    compiles.traced("grpo_gradients")
    return fp32_gradients(micro_loss, params, micro, normalizer, optimizer, policy, objective, current_as_old)


def fp32_gradients(loss_fn: Callable, params: Any, micro: dict, normalizer: jax.Array, optimizer: Optimizer,
                    *args: Any) -> tuple[jax.Array, Any, dict]:
    """(loss, fp32 gradients, aux) of a micro-batch loss (frozen leaves get no gradient); traced inside a jit.

    The frozen leaves go behind stop_gradient inside the differentiated function, so the backward pass skips
    them and keeps none of the activations only they need (a frozen vision tower's)."""

    if optimizer.sparse:  # LoRA: differentiate only the trainable leaves; no gradient of the base exists at all
        def subset_loss(trained: list, micro: dict, *rest: Any) -> tuple[jax.Array, dict]:
            return loss_fn(lora.train_mode(optimizer.fill(params, trained), micro), micro, *rest)

        (loss, aux), grads = jax.value_and_grad(subset_loss, has_aux=True)(optimizer.select(params), micro,
                                                                            normalizer, *args)
        return loss, [g.astype(jnp.float32) for g in grads], aux

    def frozen_loss(p: Any, micro: dict, *rest: Any) -> tuple[jax.Array, dict]:
        return loss_fn(lora.train_mode(optimizer.stop_frozen_gradients(p), micro), micro, *rest)

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


def first_learner_logprobs(auxes: list[dict]) -> np.ndarray:
    """The first learner forward's per-token log-probs of every row, on this host."""
    return np.concatenate([distributed.host_value(aux["logprobs"]) for aux in auxes])


@partial(jax.jit, static_argnames=("policy", "compiles"))
def policy_logprobs(params: Any, batch: Any, *, policy: Policy, compiles: CompileCounter) -> jax.Array:
    """The policy's log-probs of a batch (the frozen reference's, when beta > 0)."""
    compiles.traced("policy_logprobs")
    return policy.logprobs(params, batch)


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
