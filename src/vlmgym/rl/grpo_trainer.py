"""The GRPO trainer (and RLOO: GRPO's loss with a leave-one-out baseline). A step reads in three parts: sampling
(vlmgym.rl.sampling: the batch of scored groups), the objective (vlmgym.rl.objective: the advantages and the loss)
and the update (vlmgym.rl.update: the jitted gradients and optimizer step); this loop lays the batch out as
micro-batches and runs num_iterations updates on it."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.envs.base import Env
from vlmgym.params import TrainParams
from vlmgym.rl import grpo
from vlmgym.rl.episode_groups import later_turn_micro_batches
from vlmgym.rl.loop import Policy
from vlmgym.rl.objective import combine_figures, step_advantages
from vlmgym.rl.online import OnlineTrainer, Update
from vlmgym.rl.sampling import Batch
from vlmgym.rl.trainer_parts import group_observations, in_train_mode, micro_slices
from vlmgym.rl.update import accumulate, apply_update, first_learner_logprobs, grpo_gradients, policy_logprobs


class GRPOTrainer(OnlineTrainer):
    """GRPO (train.algorithm grpo or rloo): sample groups, score them with the env, update with the clipped
    surrogate of vlmgym.rl.objective, checkpoint. Trains the episodes of an env with tools too
    (vlmgym.rl.episode_groups). Takes ownership of `params` (OnlineTrainer)."""

    name = "grpo"

    def __init__(self, policy: Policy, env: Env, params: Any, config: TrainParams, checkpoint_dir: str | Path,
                 **options: Any):
        quantile = config.objective.top_entropy_quantile
        if quantile < 1 and not callable(getattr(policy, "logprobs_and_entropies", None)):
            raise ValueError(f"train.objective.top_entropy_quantile={quantile} ranks tokens by entropy: "
                             f"{type(policy).__name__} has no logprobs_and_entropies(params, batch)")
        # The start policy is held only for the loss's KL term.
        super().__init__(policy, env, params, config, checkpoint_dir, algorithms=("grpo", "rloo"),
                         reference_of=params if config.objective.beta > 0 else None, **options)

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"reward": f"{metrics['reward_mean']:.3f}", "kl": f"{metrics['approx_kl_behaviour']:.2e}"}

    def update(self, step: int, batch: Batch) -> Update:
        c = self.config
        mask, tokens, sampler_logprobs = batch.mask, batch.tokens, batch.sampler_logprobs
        advantages = step_advantages(batch.rewards, batch.real_rows(c.group_size), c)
        loss_mask = mask
        if c.objective.mask_truncated_completions:  # their reward still counted in the advantages above
            loss_mask = mask * ~grpo.truncated_rows(tokens, mask, self.policy.eos_ids)[:, None]
        micro_batches = []
        for rows in micro_slices(len(tokens), c.micro_batches):
            inputs = self.policy.build_batch(group_observations(batch.groups, rows, c.group_size), tokens[rows],
                                             mask[rows])
            micro = {"batch": inputs, "behaviour": sampler_logprobs[rows], "advantages": advantages[rows],
                     "mask": loss_mask[rows]}
            micro_batches.append({**micro, **self._micro_extra({**micro, "sampler_logprobs": sampler_logprobs[rows]})})
        # a multi-turn episode's later turns: rows of their own (vlmgym.rl.episode_groups); none in one-turn envs
        later, later_sampler, later_mask = later_turn_micro_batches(
            self.policy, batch.groups, advantages, c.group_size, len(tokens) // c.micro_batches, self.policy.eos_ids,
            c.objective.mask_truncated_completions, self._micro_extra)
        micro_batches += later
        normalizer = jnp.float32(grpo.aggregation_normalizer(np.concatenate([loss_mask, later_mask]),
                                                             c.objective.loss_aggregation))
        iterations, first_logprobs = self._iterations(step, micro_batches, normalizer)
        return Update(iterations, first_logprobs, np.concatenate([sampler_logprobs, later_sampler]),
                      np.concatenate([mask, later_mask]) if later else mask)

    def _iterations(self, step: int, micro_batches: list[dict], normalizer: jax.Array) -> tuple[list[dict], Any]:
        """num_iterations optimizer steps on the micro-batches; their figures and the first forward's log-probs.
        With old_logprobs: learner, the first forward's log-probs become the behaviour of the later iterations."""
        c = self.config
        iterations = []
        for iteration in range(c.num_iterations):
            current_as_old = c.old_logprobs == "learner" and iteration == 0
            grads, auxes = accumulate(partial(self._gradients, normalizer=normalizer, current_as_old=current_as_old),
                                      in_train_mode(micro_batches, self.adapters, step, iteration))
            self.params, self.opt_state, stats = apply_update(self.params, self.opt_state, grads,
                                                              optimizer=self.optimizer, compiles=self.compiles)
            if iteration == 0:
                first_logprobs = first_learner_logprobs(auxes)
                if c.old_logprobs == "learner":
                    for micro, aux in zip(micro_batches, auxes):
                        micro["behaviour"] = aux["logprobs"]
            iterations.append({**combine_figures(auxes, with_kl=c.objective.beta > 0),
                               **{k: float(v) for k, v in jax.device_get(stats).items()}})
        return iterations, first_logprobs

    def _gradients(self, micro: dict, normalizer: jax.Array, current_as_old: bool) -> tuple:
        return grpo_gradients(self.params, micro, normalizer, policy=self.policy, optimizer=self.optimizer,
                              objective=self.config.objective, compiles=self.compiles, current_as_old=current_as_old)

    def _micro_extra(self, micro: dict) -> dict:
        """What a micro-batch needs beyond its rows: the sampler's log-probs for the sampler correction, the
        reference policy's for the KL term."""
        out = {}
        if self.config.objective.sampler_correction != "none":
            out["sampler"] = micro["sampler_logprobs"]
        if self.reference() is not None:
            out["reference"] = policy_logprobs(self.reference(), micro["batch"], policy=self.policy,
                                               compiles=self.compiles)
        return out
