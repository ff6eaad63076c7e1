"""Online DPO: GRPO's sampling and scoring, then each group's best and worst answer as a preference pair, trained
against the start policy (vlmgym.rl.dpo's loss)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.config import TrainParams
from vlmgym.rl import dpo
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.losses import (
    accumulate,
    apply_update,
    combine_dpo_figures,
    dpo_gradients,
    first_learner_logprobs,
    policy_logprobs,
)
from vlmgym.rl.trainer_parts import in_train_mode, micro_slices


class DPOTrainer(GRPOTrainer):
    """Online DPO (train.algorithm dpo): one (best, worst) pair per sampled group, num_iterations updates per step.

    Holds the start policy as its reference (the implicit KL of DPO's loss), like GRPOTrainer takes ownership of
    `params`.
    """

    multi_turn = False

    name = "dpo"
    algorithms = ("online_dpo",)
    needs_reference = True
    reports_kl_to_reference = False

    def __init__(self, policy: Any, env: Any, params: Any, config: TrainParams, checkpoint_dir: str | Path,
                 **options: Any):
        if config.batch_prompts % config.micro_batches:
            raise ValueError(f"train: dpo splits its {config.batch_prompts} pairs into micro_batches="
                             f"{config.micro_batches}, which must divide them")
        super().__init__(policy, env, params, config, checkpoint_dir, **options)

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"reward": f"{metrics['reward_mean']:.3f}", "margin": f"{metrics['dpo_margin']:.3f}"}

    def step(self, step: int) -> dict[str, float]:
        collected, rewards, mask, tokens, sampler_logprobs, started = self._sample_batch(step)
        return self._finish_step(step, collected, mask, tokens, *self._dpo_updates(
            step, collected["groups"], rewards, mask, tokens, sampler_logprobs), started)

    def _dpo_updates(self, step: int, groups: list[dict], rewards: np.ndarray, mask: np.ndarray, tokens: np.ndarray,
                     sampler_logprobs: np.ndarray) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray]:
        """Online DPO on the step's groups: one (best, worst) pair per group, num_iterations updates; returns
        (figures per iteration, first learner log-probs, sampler log-probs and mask of the pair rows)."""
        c = self.config
        pairs = dpo.select_pairs(rewards, c.group_size)
        rows = dpo.pair_rows(pairs)
        # Each pair's two rows come from one group: the learner runs their prompt once (groups of two).
        observations = [groups[r // c.group_size]["obs"] for r in rows[::2]]
        # A tie's rows stay in the batch (fixed shapes: no recompiles) with weight 0 and no tokens counted.
        pair_mask = mask[rows] * np.repeat(pairs.valid, 2)[:, None]
        valid_pairs = int(pairs.valid.sum())
        normalizer = jnp.float32(max(valid_pairs, 1))
        micro_batches = []
        for part in micro_slices(len(rows) // 2, c.micro_batches):
            row_part = slice(2 * part.start, 2 * part.stop)
            batch = self.policy.build_batch(observations[part], tokens[rows][row_part], pair_mask[row_part])
            micro_batches.append({"batch": batch, "mask": pair_mask[row_part], "valid": pairs.valid[part],
                                  "reference": policy_logprobs(self.reference(), batch, policy=self.policy,
                                                               compiles=self.compiles)})
        gradient_fn = partial(dpo_gradients, normalizer=normalizer, policy=self.policy, optimizer=self.optimizer,
                              beta=c.dpo.beta, compiles=self.compiles)
        iteration_metrics = []
        for iteration in range(c.num_iterations):
            grads, auxes = accumulate(lambda micro: gradient_fn(self.params, micro),
                                      in_train_mode(micro_batches, self.adapters, step, iteration))
            self.params, self.opt_state, stats = apply_update(self.params, self.opt_state, grads,
                                                              optimizer=self.optimizer, compiles=self.compiles)
            if iteration == 0:
                first_logprobs = first_learner_logprobs(auxes)
            iteration_metrics.append({**combine_dpo_figures(auxes, valid_pairs), "dpo_pairs": float(valid_pairs),
                                      **{k: float(v) for k, v in jax.device_get(stats).items()}})
        return iteration_metrics, first_logprobs, sampler_logprobs[rows], pair_mask
