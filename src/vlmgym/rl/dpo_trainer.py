"""Online DPO: the shared sampling and scoring (vlmgym.rl.sampling), then each group's best and worst answer as a
preference pair, trained against the start policy (vlmgym.rl.dpo's loss). On an env with tools the pair is the
group's best and worst whole episode, a side's log-probability the sum of its turns' (vlmgym.rl.dpo.pair_terms)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.envs.base import Env
from vlmgym.params import TrainParams
from vlmgym.rl import dpo
from vlmgym.rl.episode_groups import later_turn_chunks, later_turn_micro_batches
from vlmgym.rl.online import OnlineTrainer, Update
from vlmgym.rl.sampling import Batch, Group
from vlmgym.rl.trainer_parts import in_train_mode, micro_slices, scalar_figures
from vlmgym.rl.update import (
    accumulate,
    apply_update,
    dpo_gradients,
    first_learner_logprobs,
    policy_logprobs,
    train_logprobs,
    weighted_logprob_gradients,
)
from vlmgym.rollout.episodes import max_turns


class DPOTrainer(OnlineTrainer):
    """Online DPO (train.algorithm dpo): one (best, worst) pair per sampled group, num_iterations updates per step;
    pairs of whole episodes on an env with tools.

    Holds the start policy as its reference (the implicit KL of DPO's loss); takes ownership of `params`
    (OnlineTrainer).
    """

    name = "dpo"

    def __init__(self, policy: Any, env: Env, params: Any, config: TrainParams, checkpoint_dir: str | Path,
                 **options: Any):
        if config.batch_prompts % config.micro_batches:
            raise ValueError(f"train: dpo splits its {config.batch_prompts} pairs into micro_batches="
                             f"{config.micro_batches}, which must divide them")
        super().__init__(policy, env, params, config, checkpoint_dir, algorithms=("online_dpo",),
                         reference_of=params, **options)

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"reward": f"{metrics['reward_mean']:.3f}", "margin": f"{metrics['dpo_margin']:.3f}"}

    def update(self, step: int, batch: Batch) -> Update:
        updates = self._episode_dpo_updates if max_turns(self.env) > 1 else self._dpo_updates
        return updates(step, batch.groups, batch.rewards, batch.mask, batch.tokens, batch.sampler_logprobs)

    def _dpo_updates(self, step: int, groups: list[Group], rewards: np.ndarray, mask: np.ndarray,
                     tokens: np.ndarray, sampler_logprobs: np.ndarray) -> Update:
        """Online DPO on the step's groups: one (best, worst) pair per group, num_iterations updates, over the pair
        rows."""
        c = self.config
        pairs = dpo.select_pairs(rewards, c.group_size)
        rows = dpo.pair_rows(pairs)
        # Each pair's two rows come from one group: the learner runs their prompt once (groups of two).
        observations = [groups[r // c.group_size].obs for r in rows[::2]]
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
            iteration_metrics.append({**_pair_figures(auxes, valid_pairs), "dpo_pairs": float(valid_pairs),
                                      **{k: float(v) for k, v in jax.device_get(stats).items()}})
        return Update(iteration_metrics, first_logprobs, sampler_logprobs[rows], pair_mask)

    def _episode_dpo_updates(self, step: int, groups: list[Group], rewards: np.ndarray, mask: np.ndarray,
                             tokens: np.ndarray, sampler_logprobs: np.ndarray) -> Update:
        """Online DPO on whole episodes: each group's best and worst episode by final reward, every policy turn of
        both a learner row (turn 0's sharing the group's prompt, later turns' with the conversation before them as
        prompt: vlmgym.rl.episode_groups), tool replies context only. The loss couples rows that sit in different
        micro-batches, so each iteration runs one forward for the rows' coefficients (dpo.pair_terms) and then
        accumulates coefficient-weighted log-prob gradients: the gradient of the DPO loss itself."""
        c = self.config
        pairs = dpo.select_pairs(rewards, c.group_size)
        rows = dpo.pair_rows(pairs)
        count = len(pairs.valid)
        pair_mask = mask[rows] * np.repeat(pairs.valid, 2)[:, None]

        def reference(batch: Any) -> dict:
            return {"reference": policy_logprobs(self.reference(), batch, policy=self.policy, compiles=self.compiles)}

        observations = [groups[r // c.group_size].obs for r in rows[::2]]
        micro_batches = []
        for part in micro_slices(count, c.micro_batches):
            row_part = slice(2 * part.start, 2 * part.stop)
            batch = self.policy.build_batch(observations[part], tokens[rows][row_part], pair_mask[row_part])
            micro_batches.append({"batch": batch, "mask": pair_mask[row_part], **reference(batch)})
        pair_of_row = [np.repeat(np.arange(count), 2)]
        sign_of_row = [np.tile(np.float32([1.0, -1.0]), count)]
        # The later turns of each valid pair's two episodes (group g holds pair g), with their side as the
        # episode's value: +1 chosen, -1 rejected.
        side = np.zeros(len(rewards), np.float32)
        side[pairs.chosen[pairs.valid]], side[pairs.rejected[pairs.valid]] = 1.0, -1.0
        sides = [replace(group, later=tuple(turn for turn in group.later if side[g * c.group_size + turn.member]))
                 for g, group in enumerate(groups)]
        chunks = later_turn_chunks(sides, max(2 * count // c.micro_batches, 1))
        later, later_sampler, later_mask = later_turn_micro_batches(
            self.policy, sides, side, c.group_size, 0, self.policy.eos_ids, False,
            lambda micro: reference(micro["batch"]), chunks)
        for micro, chunk in zip(later, chunks):
            micro_batches.append({"batch": micro["batch"], "mask": micro["mask"], "reference": micro["reference"]})
            pair_of_row.append(np.array([g for g, _ in chunk]))
            sign_of_row.append(micro["advantages"])
        pair_of_row, sign_of_row = np.concatenate(pair_of_row), np.concatenate(sign_of_row)
        reference_sums = _row_sums([m["reference"] for m in micro_batches], micro_batches)
        iteration_metrics, first_logprobs = self._episode_iterations(step, micro_batches, reference_sums,
                                                                     pair_of_row, sign_of_row, pairs.valid)
        return Update(iteration_metrics, first_logprobs, np.concatenate([sampler_logprobs[rows], later_sampler]),
                      np.concatenate([pair_mask, later_mask]))

    def _episode_iterations(self, step: int, micro_batches: list[dict], reference_sums: np.ndarray,
                            pair_of_row: np.ndarray, sign_of_row: np.ndarray, valid: np.ndarray
                            ) -> tuple[list[dict], np.ndarray]:
        """num_iterations updates of episode pairs: each a forward for every row's coefficient (dpo.pair_terms),
        then the coefficient-weighted log-prob gradients; their figures and the first forward's log-probs."""
        c = self.config
        valid_pairs = int(valid.sum())
        iteration_metrics = []
        for iteration in range(c.num_iterations):
            micros = in_train_mode(micro_batches, self.adapters, step, iteration)
            logprobs = [train_logprobs(self.params, m, policy=self.policy, compiles=self.compiles) for m in micros]
            terms = dpo.pair_terms(_row_sums(logprobs, micros), reference_sums, pair_of_row, sign_of_row,
                                   valid, beta=c.dpo.beta, normalizer=max(valid_pairs, 1))
            weighted, start = [], 0
            for micro in micros:
                stop = start + len(micro["mask"])
                weighted.append({**micro, "coefficients": terms.coefficients[start:stop]})
                start = stop
            grads, _ = accumulate(lambda micro: weighted_logprob_gradients(
                self.params, micro, jnp.float32(1.0), policy=self.policy, optimizer=self.optimizer,
                compiles=self.compiles), weighted)
            self.params, self.opt_state, stats = apply_update(self.params, self.opt_state, grads,
                                                              optimizer=self.optimizer, compiles=self.compiles)
            if iteration == 0:
                first_logprobs = np.concatenate([np.asarray(jax.device_get(x)) for x in logprobs])
            per_pair = 1.0 / max(valid_pairs, 1)
            iteration_metrics.append({
                "loss": terms.loss, "dpo_margin": terms.margin_sum * per_pair,
                "dpo_accuracy": terms.accuracy_sum * per_pair, "dpo_chosen_reward": terms.chosen_reward_sum * per_pair,
                "dpo_rejected_reward": terms.rejected_reward_sum * per_pair, "dpo_pairs": float(valid_pairs),
                **{k: float(v) for k, v in jax.device_get(stats).items()}})
        return iteration_metrics, first_logprobs


def _row_sums(logprobs: list, micros: list[dict]) -> np.ndarray:
    """Each row's log-probs summed over its active tokens, all micro-batches' rows in order."""
    return np.concatenate([(np.asarray(jax.device_get(lp), np.float64) * np.asarray(m["mask"], np.float64)).sum(-1)
                           for lp, m in zip(logprobs, micros)])


def _pair_figures(auxes: list[dict], pairs: int) -> dict[str, float]:
    """One update's DPO figures from its micro-batches' sums: the loss, and per valid pair the rest."""
    auxes = scalar_figures(auxes)
    out = {"loss": sum(float(a["loss"]) for a in auxes)}
    for name in ("dpo_margin", "dpo_accuracy", "dpo_chosen_reward", "dpo_rejected_reward"):
        out[name] = sum(float(a[name]) for a in auxes) / max(pairs, 1)
    return out
