"""PPO training loop: the shared sampler (vlmgym.rl.sampling) and loop (vlmgym.rl.online), with a value head, GAE
and a clipped value loss.

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

from vlmgym.envs.base import Env
from vlmgym.params import TrainParams
from vlmgym.rl import grpo, ppo
from vlmgym.rl.loop import CompileCounter, Policy
from vlmgym.rl.objective import combine_figures, loss_figures
from vlmgym.rl.online import OnlineTrainer, Update
from vlmgym.rl.optim import Optimizer
from vlmgym.rl.sampling import Batch
from vlmgym.rl.trainer_parts import group_observations, in_train_mode, micro_slices, scalar_figures
from vlmgym.rl.update import accumulate, apply_update, fp32_gradients, policy_logprobs
from vlmgym.rollout.episodes import max_turns


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
    aux = {"logprobs": jax.lax.stop_gradient(logprobs), "tokens": tokens, "value_loss": value.loss,
           "value_clip_fraction": value.clip_fraction * tokens, **loss_figures(out, tokens)}
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


class PPOTrainer(OnlineTrainer):
    """PPO with a value head on the policy (see the module docstring). Takes ownership of `params`
    (OnlineTrainer)."""

    name = "ppo"

    def __init__(self, policy: Policy, env: Env, params: Any, config: TrainParams, checkpoint_dir: str | Path,
                 **options: Any):
        if config.objective.beta > 0:
            raise ValueError("train.objective.beta is GRPO's KL term in the loss; PPO's KL to the start policy is in "
                             "the reward: set train.ppo.kl_coef instead")
        if max_turns(env) > 1:
            raise ValueError(f"train.algorithm {config.algorithm!r} trains one-turn answers; env {env.name!r} runs "
                             f"episodes of up to {env.max_turns} turns: train them with grpo, rloo or dpo")
        ppo.check_critic(config.ppo.critic)
        combined = {"policy": params, "value": ppo.init_value_head(policy.feature_size)}
        # The start policy is held only for the reward's KL penalty.
        super().__init__(policy, env, combined, config, checkpoint_dir, algorithms=("ppo",),
                         reference_of=params if config.ppo.kl_coef > 0 else None, **options)
        self.settings = PPOSettings(epsilon=config.objective.epsilon, epsilon_high=config.objective.epsilon_high,
                                    aggregation=config.objective.loss_aggregation, vf_coef=config.ppo.vf_coef,
                                    cliprange_value=config.ppo.cliprange_value,
                                    detached=config.ppo.critic == "detached")

    def model_params(self) -> Any:
        return self.params["policy"]

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"reward": f"{metrics['reward_mean']:.3f}", "vf": f"{metrics['value_loss']:.3f}"}

    def update(self, step: int, batch: Batch) -> Update:
        c = self.config
        mask, tokens, sampler_logprobs = batch.mask, batch.tokens, batch.sampler_logprobs
        slices = micro_slices(len(tokens), c.micro_batches)
        micro_batches, learner, values, reference = [], [], [], []
        for rows in slices:
            inputs = self.policy.build_batch(group_observations(batch.groups, rows, c.group_size), tokens[rows],
                                             mask[rows])
            logprobs, row_values = ppo_forward(self.params, inputs, policy=self.policy, compiles=self.compiles)
            learner.append(np.asarray(logprobs))
            values.append(np.asarray(row_values))
            if self.reference() is not None:
                reference.append(np.asarray(policy_logprobs(self.reference(), inputs, policy=self.policy,
                                                            compiles=self.compiles)))
            micro_batches.append({"batch": inputs, "mask": mask[rows]})
        learner_logprobs = np.concatenate(learner)
        old_values = np.concatenate(values) * mask
        behaviour = learner_logprobs if c.old_logprobs == "learner" else sampler_logprobs
        reference_logprobs = np.concatenate(reference) if reference else None
        token_rewards = ppo.token_rewards(batch.rewards, mask, kl_coef=c.ppo.kl_coef, logprobs=behaviour,
                                          reference_logprobs=reference_logprobs)
        advantages, returns = ppo.gae(token_rewards, old_values, mask, gamma=c.ppo.gamma, lam=c.ppo.lam)
        whitened = ppo.whiten(advantages, mask)
        for micro, rows in zip(micro_batches, slices):
            micro.update(behaviour=behaviour[rows], advantages=whitened[rows].astype(np.float32),
                         returns=returns[rows].astype(np.float32), old_values=old_values[rows].astype(np.float32))
        normalizer = jnp.float32(grpo.aggregation_normalizer(mask, c.objective.loss_aggregation))
        figures = _value_figures(old_values, returns, mask)
        if reference_logprobs is not None:
            figures["kl_to_reference"] = float(((behaviour - reference_logprobs) * mask).sum() / max(mask.sum(), 1.0))
        return Update(self._iterations(step, micro_batches, normalizer), learner_logprobs, sampler_logprobs, mask,
                      figures)

    def _iterations(self, step: int, micro_batches: list[dict], normalizer: jax.Array) -> list[dict]:
        """num_iterations optimizer steps on the micro-batches, and their figures."""
        iterations = []
        for iteration in range(self.config.num_iterations):
            grads, auxes = accumulate(lambda micro: ppo_gradients(self.params, micro, normalizer, policy=self.policy,
                                                                  optimizer=self.optimizer, settings=self.settings,
                                                                  compiles=self.compiles),
                                      in_train_mode(micro_batches, self.adapters, step, iteration))
            self.params, self.opt_state, stats = apply_update(self.params, self.opt_state, grads,
                                                              optimizer=self.optimizer, compiles=self.compiles)
            iterations.append({**_combine_value_figures(auxes), **combine_figures(auxes, with_kl=False),
                               **{k: float(v) for k, v in jax.device_get(stats).items()}})
        return iterations


def _value_figures(old_values: np.ndarray, returns: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """The critic's figures of the step: its values and returns over counted tokens, and how much of the returns
    it explains."""
    active = mask > 0
    return {"value_mean": float(old_values[active].mean()) if active.any() else 0.0,
            "return_mean": float(returns[active].mean()) if active.any() else 0.0,
            "explained_variance": ppo.explained_variance(old_values, returns, mask)}


def _combine_value_figures(auxes: list[dict]) -> dict[str, float]:
    auxes = scalar_figures(auxes)
    tokens = max(sum(float(a["tokens"]) for a in auxes), 1.0)
    return {"value_loss": sum(float(a["value_loss"]) for a in auxes),
            "value_clip_fraction": sum(float(a["value_clip_fraction"]) for a in auxes) / tokens}
