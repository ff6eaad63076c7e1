"""The SFT trainer: teacher-forced cross entropy on the env's ideal answers (or, with sft.label_noise, a noisy
teacher's: vlmgym.rl.noisy_teacher)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.envs.base import Env
from vlmgym.envs.multiturn import sft_turns
from vlmgym.params import SFTParams
from vlmgym.rl.loop import (
    DataOrder,
    MetricsCallback,
    Policy,
    TrainingLoop,
)
from vlmgym.rl.noisy_teacher import NoisyTeacher
from vlmgym.rl.prefetch import ResetPrefetcher
from vlmgym.rl.trainer_parts import (
    adapter_settings,
    in_train_mode,
    make_optimizer,
    make_validator,
    micro_slices,
)
from vlmgym.rl.update import (
    accumulate,
    apply_update,
    policy_logprobs,
    sft_gradients,
)
from vlmgym.rollout.episodes import max_turns


def check_target_budget(policy: Any, env: Env, samples: int) -> None:
    """ValueError at once when most of the first `samples` ideal answers do not fit the policy's token budget
    (sft.max_target_tokens). The trainer skips a target too long for it, counted, and stops only when a batch cannot
    be filled: after any warm-up, minutes or hours into a run."""
    count = min(len(env), samples)
    lengths = []
    for index in range(count):
        state, obs = env.reset(index)
        turns = sft_turns(env, state, obs) if max_turns(env) > 1 else [(obs, env.sft_target(state.meta))]
        lengths += [len(policy.processor.tokenizer.encode(text, add_special_tokens=False)) + 1 for _, text in turns]
    too_long = sum(length > policy.max_new_tokens for length in lengths)
    if lengths and too_long * 2 > len(lengths):
        raise ValueError(f"sft.max_target_tokens={policy.max_new_tokens} is shorter than {too_long} of the first "
                         f"{len(lengths)} SFT targets (the longest {max(lengths)} tokens with its end-of-turn token): "
                         f"raise sft.max_target_tokens")


class SFTTrainer(TrainingLoop):
    """Supervised warm start: teacher-forced cross entropy on the env's ideal answer for each sample.

    Like the online trainers it takes ownership of `params` (donated to the first update).
    """

    name = "sft"
    section = "sft"

    def __init__(self, policy: Policy, env: Env, params: Any, config: SFTParams, checkpoint_dir: str | Path, *,
                 metrics_callback: MetricsCallback | None = None, progress_bar: bool = True,
                 val_env: Env | None = None):
        super().__init__(total_steps=config.steps, checkpoint_dir=checkpoint_dir, save_every=config.checkpointing.every,
                         keep=config.checkpointing.keep, metrics_callback=metrics_callback, progress_bar=progress_bar)
        self.validator = make_validator(policy, val_env, config, checkpoint_dir, extra=self.validation_loss)
        if config.batch_size % config.micro_batches:
            raise ValueError(f"sft: batch_size={config.batch_size} does not split into "
                             f"micro_batches={config.micro_batches}")
        self.policy, self.env, self.config = policy, env, config
        self.optimizer = make_optimizer(config, params)
        self.adapters = adapter_settings(config, params)
        self.params, self.opt_state = params, self.optimizer.init_placed(params)
        self.rng = jax.random.key(config.seed)  # unused by SFT itself; saved so every loop resumes alike
        self.data = DataOrder(len(env), config.seed)
        self.prefetch = ResetPrefetcher(env, getattr(policy, "prepare_ahead", None))
        if config.label_noise and max_turns(env) > 1:
            raise ValueError(f"sft.label_noise: {env.name} plays episodes of several turns, whose demonstrations "
                             "have no single answer to mislabel; set it to 0")
        self.teacher = NoisyTeacher(env, config.label_noise)

    def loop_state(self) -> dict:
        return {"data": self.data.state()}

    def close(self) -> None:
        self.prefetch.close()

    def load_loop_state(self, state: dict) -> None:
        self.data = DataOrder.from_state(len(self.env), self.config.seed, state["data"])

    def validation_loss(self, params: Any) -> dict[str, float]:
        """Teacher-forced loss on the val split's ideal answers (batches padded to batch_size: one compile)."""
        env, size = self.validator.env, self.config.batch_size
        total = count = 0.0
        for start in range(0, len(env), size):
            observations, rows = [], []
            for index in range(start, min(start + size, len(env))):
                try:
                    turns = self._turns(env, *env.reset(index))
                except ValueError:
                    continue  # too long for the budget: skipped in training too
                observations += [obs for obs, _ in turns]
                rows += [encoded for _, encoded in turns]
            if not rows:
                continue
            padding = size * max_turns(env) - len(rows)
            tokens = np.concatenate([t for t, _ in rows] + [rows[-1][0]] * padding)
            mask = np.concatenate([m for _, m in rows] + [np.zeros_like(rows[-1][1])] * padding)
            batch = self.policy.build_batch(observations + [observations[-1]] * padding, tokens, mask)
            logprobs = np.asarray(policy_logprobs(params, batch, policy=self.policy, compiles=self.compiles))
            total -= float((logprobs * mask).sum())
            count += float(mask.sum())
        return {"val/loss": total / max(count, 1.0)}

    def _turns(self, env: Env, state: Any, obs: dict,
               target: str | None = None) -> list[tuple[dict, tuple[np.ndarray, np.ndarray]]]:
        """A sample's (observation, encoded target) rows: one per policy turn of its ideal episode (one row in a
        one-turn env, taught `target` when given); ValueError when a target does not fit the token budget."""
        if max_turns(env) > 1:
            turns = sft_turns(env, state, obs)
        else:
            turns = [(obs, env.sft_target(state.meta) if target is None else target)]
        return [(turn_obs, self.policy.encode_targets([text])) for turn_obs, text in turns]

    def step(self, step: int) -> dict[str, float]:
        observations, rows, skipped, samples, mislabelled = [], [], 0, 0, 0
        while samples < self.config.batch_size:
            for state, obs in self.prefetch.resets(self.data.take(self.config.batch_size - samples)):
                try:
                    target, wrong = self.teacher.target(state) if max_turns(self.env) == 1 else (None, False)
                    turns = self._turns(self.env, state, obs, target)
                except ValueError:
                    # A target longer than the token budget would teach an answer without its end: skip it.
                    skipped += 1
                    if skipped > 10 * self.config.batch_size:
                        raise
                    continue
                samples += 1
                mislabelled += wrong
                observations += [turn_obs for turn_obs, _ in turns]
                rows += [encoded for _, encoded in turns]
        self.prefetch.ahead(self.data.peek(self.config.batch_size))
        if max_turns(self.env) > 1:  # episodes of several turns: padded to one shape, masked rows (one compile)
            padding = self.config.batch_size * max_turns(self.env) - len(rows)
            observations += [observations[-1]] * padding
            rows += [(rows[-1][0], np.zeros_like(rows[-1][1]))] * padding
        tokens = np.concatenate([t for t, _ in rows])
        mask = np.concatenate([m for _, m in rows])
        normalizer = jnp.float32(max(float(mask.sum()), 1.0))
        started = time.perf_counter()
        micro_batches = [{"batch": self.policy.build_batch(observations[rows], tokens[rows], mask[rows]),
                          "mask": mask[rows]} for rows in micro_slices(len(observations), self.config.micro_batches)]
        grads, auxes = accumulate(lambda micro: sft_gradients(self.params, micro, normalizer, policy=self.policy,
                                                              optimizer=self.optimizer, compiles=self.compiles),
                                  in_train_mode(micro_batches, self.adapters, step))
        self.params, self.opt_state, stats = apply_update(self.params, self.opt_state, grads,
                                                          optimizer=self.optimizer, compiles=self.compiles)
        out = {k: float(v) for k, v in jax.device_get(stats).items()}
        out["loss"] = sum(float(a["loss"]) for a in auxes)
        out["tokens"] = float(mask.sum())
        out["tokens_per_s"] = out["tokens"] / max(time.perf_counter() - started, 1e-9)
        out["data_wait_s"] = self.prefetch.take_wait()
        lengths = mask.sum(axis=1)
        out["target_length"] = float(lengths[lengths > 0].mean())  # padding rows of episodes left out
        out["targets_skipped"] = float(skipped)
        if self.config.label_noise:
            out["targets_mislabelled"] = mislabelled / self.config.batch_size
        return out
