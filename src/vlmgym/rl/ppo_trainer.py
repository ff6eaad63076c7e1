"""PPO training loop: GRPO's sampling and bookkeeping, with a value head, GAE and a clipped value loss.

Each step samples `batch_prompts x group_size` completions exactly as GRPO does (so the two compare at the same
number of sampled completions), but each completion is its own episode: a forward pass gives the value of every
token's state, the task reward arrives at the last token (plus an optional KL-to-start penalty per token), GAE
turns rewards and values into per-token advantages (whitened over the batch) and returns, and `num_iterations`
updates minimise the clipped surrogate plus `ppo.vf_coef` x the clipped value loss (vlmgym.rl.ppo).

The critic is a linear value head on the policy's final hidden states, trained with the policy by one optimizer
(trainer params = {"policy": ..., "value": ...}; checkpoints hold both). `ppo.critic: head` lets the value loss
shape the shared trunk (TRL's AutoModelForCausalLMWithValueHead); `detached` stops that gradient, so the critic
learns on the policy's representation without ever moving the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.models.qwen3_vl import lora
from vlmgym.params import TrainParams
from vlmgym.rl import grpo, ppo
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.loop import CompileCounter, MetricsCallback, Policy
from vlmgym.rl.losses import accumulate, apply_update, combine_grpo_figures, fp32_gradients, policy_logprobs
from vlmgym.rl.optim import Optimizer
from vlmgym.rl.trainer_parts import SamplesCallback, group_observations, in_train_mode, micro_slices


@dataclass(frozen=True)
class PPOSettings:
    """Static settings of the jitted PPO update (hashable)."""

    epsilon: float
    epsilon_high: float
    aggregation: str
    vf_coef: float
    cliprange_value: float
    detached: bool


def _ppo_micro_loss(params: Any, micro: dict, normalizer: jax.Array, policy: Policy,
                    settings: PPOSettings) -> tuple[jax.Array, dict]:
    logprobs, features = policy.logprobs_and_features(params["policy"], micro["batch"])
    values = ppo.value_head(params["value"], features, detached=settings.detached)
    out = grpo.grpo_loss(logprobs, micro["behaviour"], micro["advantages"], micro["mask"], epsilon=settings.epsilon,
                         epsilon_high=settings.epsilon_high, aggregation=settings.aggregation, normalizer=normalizer)
    value = ppo.value_loss(values, micro["old_values"], micro["returns"], micro["mask"], clip=settings.cliprange_value,
                           aggregation=settings.aggregation, normalizer=normalizer)
    tokens = micro["mask"].astype(jnp.float32).sum()
    aux = {"logprobs": jax.lax.stop_gradient(logprobs), "tokens": tokens, "policy_loss": out.policy_loss,
           "kl_to_reference": out.kl_to_reference, "value_loss": value.loss,
           "value_clip_fraction": value.clip_fraction * tokens,
           "clip_fraction_low": out.clip_fraction_low * tokens, "clip_fraction_high": out.clip_fraction_high * tokens,
           "approx_kl_behaviour": out.approx_kl_behaviour * tokens, "ratio_mean": out.ratio_mean * tokens,
           "ratio_max": out.ratio_max, "ratio_min": out.ratio_min}
    return out.loss + settings.vf_coef * value.loss, aux


@partial(jax.jit, static_argnames=("policy", "optimizer", "settings", "compiles"))
def ppo_gradients(params: Any, micro: dict, normalizer: jax.Array, *, policy: Policy, optimizer: Optimizer,
                  settings: PPOSettings, compiles: CompileCounter) -> tuple[jax.Array, Any, dict]:
    """PPO loss (policy + vf_coef x value), fp32 gradients of policy and value head, and figures of a micro-batch."""
    compiles.traced("ppo_gradients")
    return fp32_gradients(_ppo_micro_loss, params, micro, normalizer, optimizer, policy, settings)


@partial(jax.jit, static_argnames=("policy", "compiles"))
def ppo_forward(params: Any, batch: Any, *, policy: Policy, compiles: CompileCounter) -> tuple[jax.Array, jax.Array]:
    """Log-probs and values [batch, len] of the sampled completions before the update (GAE's values)."""
    compiles.traced("ppo_forward")
    logprobs, features = policy.logprobs_and_features(params["policy"], batch)
    return logprobs, ppo.value_head(params["value"], features, detached=True)


class PPOTrainer(GRPOTrainer):
    """PPO with a value head on the policy (see the module docstring). Takes ownership of `params` like GRPO."""

    multi_turn = False

    name = "ppo"
    algorithms = ("ppo",)
    reports_kl_to_reference = False  # PPO's KL to the start policy is in the reward (ppo.kl_coef), not the loss

    def __init__(self, policy: Policy, env: Any, params: Any, config: TrainParams, checkpoint_dir: str | Path, *,
                 metrics_callback: MetricsCallback | None = None, samples_callback: SamplesCallback | None = None,
                 progress_bar: bool = True, val_env: Any = None):
        if config.beta > 0:
            raise ValueError("train.beta is GRPO's KL term in the loss; PPO's KL to the start policy is in the "
                             "reward: set train.ppo.kl_coef instead")
        ppo.check_critic(config.ppo.critic)
        adapted = lora.has_adapters(params)  # LoRA: the reference is the base inside the trained tree, no copy
        reference = jax.tree.map(jnp.copy, params) if config.ppo.kl_coef > 0 and not adapted else None
        combined = {"policy": params, "value": ppo.init_value_head(policy.feature_size)}
        super().__init__(policy, env, combined, config, checkpoint_dir, metrics_callback=metrics_callback,
                         samples_callback=samples_callback, progress_bar=progress_bar, val_env=val_env)
        self.reference_params = reference
        self.reference_is_base = config.ppo.kl_coef > 0 and adapted
        self.settings = PPOSettings(epsilon=config.epsilon, epsilon_high=config.epsilon_high,
                                    aggregation=config.loss_aggregation, vf_coef=config.ppo.vf_coef,
                                    cliprange_value=config.ppo.cliprange_value,
                                    detached=config.ppo.critic == "detached")

    def model_params(self) -> Any:
        return self.params["policy"]

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"reward": f"{metrics['reward_mean']:.3f}", "vf": f"{metrics['value_loss']:.3f}"}

    def step(self, step: int) -> dict[str, float]:
        c = self.config
        collected, rewards, mask, tokens, sampler_logprobs, started = self._sample_batch(step)
        groups = collected["groups"]
        slices = micro_slices(len(tokens), c.micro_batches)
        micro_batches, learner, values, reference = [], [], [], []
        for rows in slices:
            batch = self.policy.build_batch(group_observations(groups, rows, c.group_size), tokens[rows], mask[rows])
            logprobs, row_values = ppo_forward(self.params, batch, policy=self.policy, compiles=self.compiles)
            learner.append(np.asarray(logprobs))
            values.append(np.asarray(row_values))
            if self.reference() is not None:
                reference.append(np.asarray(policy_logprobs(self.reference(), batch, policy=self.policy,
                                                            compiles=self.compiles)))
            micro_batches.append({"batch": batch, "mask": mask[rows]})
        learner_logprobs = np.concatenate(learner)
        old_values = np.concatenate(values) * mask
        behaviour = learner_logprobs if c.old_logprobs == "learner" else sampler_logprobs
        reference_logprobs = np.concatenate(reference) if reference else None
        token_rewards = ppo.token_rewards(rewards, mask, kl_coef=c.ppo.kl_coef, logprobs=behaviour,
                                          reference_logprobs=reference_logprobs)
        advantages, returns = ppo.gae(token_rewards, old_values, mask, gamma=c.ppo.gamma, lam=c.ppo.lam)
        whitened = ppo.whiten(advantages, mask)
        for micro, rows in zip(micro_batches, slices):
            micro.update(behaviour=behaviour[rows], advantages=whitened[rows].astype(np.float32),
                         returns=returns[rows].astype(np.float32), old_values=old_values[rows].astype(np.float32))
        normalizer = jnp.float32(grpo.aggregation_normalizer(mask, c.loss_aggregation))
        iteration_metrics = []
        for iteration in range(c.num_iterations):
            grads, auxes = accumulate(lambda micro: ppo_gradients(self.params, micro, normalizer, policy=self.policy,
                                                                  optimizer=self.optimizer, settings=self.settings,
                                                                  compiles=self.compiles),
                                      in_train_mode(micro_batches, self.adapters, step, iteration))
            self.params, self.opt_state, stats = apply_update(self.params, self.opt_state, grads,
                                                              optimizer=self.optimizer, compiles=self.compiles)
            iteration_metrics.append({**_combine_value_figures(auxes), **combine_grpo_figures(auxes),
                                      **{k: float(v) for k, v in jax.device_get(stats).items()}})
        out = self._finish_step(step, collected, mask, tokens, iteration_metrics, learner_logprobs, sampler_logprobs,
                                mask, started)
        active = mask > 0
        out.update({"value_mean": float(old_values[active].mean()) if active.any() else 0.0,
                    "return_mean": float(returns[active].mean()) if active.any() else 0.0,
                    "explained_variance": ppo.explained_variance(old_values, returns, mask)})
        if reference_logprobs is not None:
            out["kl_to_reference"] = float(((behaviour - reference_logprobs) * mask).sum()
                                           / max(mask.sum(), 1.0))
        return out


def _combine_value_figures(auxes: list[dict]) -> dict[str, float]:
    auxes = jax.device_get(auxes)
    tokens = max(sum(float(a["tokens"]) for a in auxes), 1.0)
    return {"value_loss": sum(float(a["value_loss"]) for a in auxes),
            "value_clip_fraction": sum(float(a["value_clip_fraction"]) for a in auxes) / tokens}
