"""The GRPO trainer (and RLOO: GRPO's loss with a leave-one-out baseline): sample groups, score them, update with
the clipped surrogate."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.eval.metrics import answer_spread
from vlmgym.models.qwen3_vl import lora
from vlmgym.params import TrainParams
from vlmgym.rl import grpo
from vlmgym.rl.episode_groups import (
    final_episode_rewards,
    later_turn_micro_batches,
    max_turns,
    sample_episode_groups,
)
from vlmgym.rl.loop import (
    DataOrder,
    MetricsCallback,
    Policy,
    TrainingLoop,
    score,
)
from vlmgym.rl.losses import (
    LossSettings,
    accumulate,
    apply_update,
    behaviour_statistics,
    combine_grpo_figures,
    first_learner_logprobs,
    group_advantages,
    grpo_gradients,
    policy_logprobs,
)
from vlmgym.rl.multiprocess import any_process, check_multiprocess, gathered_collection
from vlmgym.rl.prefetch import ResetPrefetcher
from vlmgym.rl.trainer_parts import (
    SamplesCallback,
    adapter_settings,
    final_rewards,
    group_observations,
    in_train_mode,
    make_optimizer,
    make_validator,
    micro_slices,
    part_figures,
)
from vlmgym.runtime import distributed


class GRPOTrainer(TrainingLoop):
    """GRPO: sample groups, score them with the env, update with the clipped surrogate, checkpoint.

    The trainer takes ownership of `params`: their buffers are donated to the first update (no second copy of
    the model in memory), so the caller must not use them afterwards; `trainer.params` holds the current ones.
    """

    name = "grpo"
    algorithms = ("grpo", "rloo")  # the train.algorithm values this class runs
    needs_reference = False  # whether the loss itself needs the start policy (GRPO only with beta > 0)
    reports_kl_to_reference = True  # the loss's k3 KL term is GRPO's: other losses leave the figure out
    multi_turn = True  # trains the episodes of an env with tools (vlmgym.rl.episode_groups)

    def __init__(self, policy: Policy, env: Any, params: Any, config: TrainParams, checkpoint_dir: str | Path, *,
                 metrics_callback: MetricsCallback | None = None, samples_callback: SamplesCallback | None = None,
                 progress_bar: bool = True, val_env: Any = None):
        super().__init__(total_steps=config.steps, checkpoint_dir=checkpoint_dir, save_every=config.checkpointing.every,
                         keep=config.checkpointing.keep, metrics_callback=metrics_callback, progress_bar=progress_bar)
        self.validator = make_validator(policy, val_env, config, checkpoint_dir)
        if (config.batch_prompts * config.group_size) % config.micro_batches:
            raise ValueError(f"train: {config.batch_prompts} x {config.group_size} sequences do not split into "
                             f"micro_batches={config.micro_batches}")
        if config.algorithm not in self.algorithms:
            raise ValueError(f"train: {type(self).__name__} runs train.algorithm {' or '.join(self.algorithms)}, "
                             f"not {config.algorithm!r} (vlmgym.rl.stage_setup.trainer_class picks the trainer)")
        if config.top_entropy_quantile < 1 and not callable(getattr(policy, "logprobs_and_entropies", None)):
            raise ValueError(f"train.top_entropy_quantile={config.top_entropy_quantile} ranks tokens by entropy: "
                             f"{type(policy).__name__} has no logprobs_and_entropies(params, batch)")
        if max_turns(env) > 1 and not self.multi_turn:
            raise ValueError(f"train.algorithm {config.algorithm!r} trains one-turn answers; env {env.name!r} runs "
                             f"episodes of up to {env.max_turns} turns: train them with grpo, rloo or dpo")
        if max_turns(env) > 1 and (config.overlong_buffer or distributed.count() > 1):
            raise ValueError(f"train: env {env.name!r} runs episodes of up to {env.max_turns} turns, which "
                             "train.overlong_buffer and training over several processes do not support yet")
        self.policy, self.env, self.config = policy, env, config
        self.samples_callback = samples_callback
        self.optimizer = make_optimizer(config, params)
        self.adapters = adapter_settings(config, params)
        # The reference policy is a frozen copy of the starting params, held only when the KL term is on or the
        # loss needs it (needs_reference).
        holds_reference = config.beta > 0 or self.needs_reference
        # With LoRA the reference is the base inside the trained tree (its adapters left out): no copy at all.
        self.reference_is_base = holds_reference and lora.has_adapters(params)
        self.reference_params = (jax.tree.map(jnp.copy, params) if holds_reference and not self.reference_is_base
                                 else None)
        self.params, self.opt_state = params, self.optimizer.init_placed(params)
        self.rng = jax.random.key(config.seed)
        self.data = DataOrder(len(env), config.seed)
        self.prefetch = ResetPrefetcher(env, getattr(policy, "prepare_ahead", None))
        if distributed.count() > 1:
            check_multiprocess(config, policy)

    def loop_state(self) -> dict:
        return {"data": self.data.state()}

    def load_loop_state(self, state: dict) -> None:
        self.data = DataOrder.from_state(len(self.env), self.config.seed, state["data"])

    def reference(self) -> Any:
        """The frozen reference policy's params (None when none is held)."""
        return lora.strip(self.model_params()) if self.reference_is_base else self.reference_params

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"reward": f"{metrics['reward_mean']:.3f}", "kl": f"{metrics['approx_kl_behaviour']:.2e}"}

    def _gradients(self, micro: dict, normalizer: jax.Array, settings: LossSettings) -> tuple:
        return grpo_gradients(self.params, micro, normalizer, policy=self.policy, optimizer=self.optimizer,
                              settings=settings, compiles=self.compiles)

    def _settings(self, current_as_old: bool) -> LossSettings:
        c = self.config
        return LossSettings(epsilon=c.epsilon, epsilon_high=c.epsilon_high, aggregation=c.loss_aggregation,
                            beta=c.beta, current_as_old=current_as_old,
                            importance_sampling_level=c.importance_sampling_level,
                            sampler_correction=c.sampler_correction, sampler_correction_cap=c.sampler_correction_cap,
                            sampler_correction_floor=c.sampler_correction_floor,
                            top_entropy_quantile=c.top_entropy_quantile)

    def _collect(self, step: int, rng: jax.Array) -> dict:
        """Sample and score groups until the batch is full (dropping the groups whose filter_metric does not vary
        when filtering). Each process fills its own share of the step's prompts (all of them in a single-process
        run), and every process samples as many rounds as the one that needs the most (the rounds' data and the
        sampling copy of the params are shared), so the data order stays the same everywhere."""
        c = self.config
        # The curriculum follows training progress, not env resets (which sampling rounds would skew).
        self.env.set_progress(step / self.total_steps)
        first, stop = distributed.local_range(c.batch_prompts)
        tally = {"sampled_groups": 0, "zero_std_groups": 0, "sampled_tokens": 0, "rollout_time": 0.0,
                 "sampled_rewards": [], "final_rewards": [], "overlong_penalty": [], "sampled_infos": [],
                 "sampled_texts": []}
        kept, spare, rounds = [], [], 0
        while True:
            for group in self._sample_round(jax.random.fold_in(rng, rounds), first, stop, tally):
                if c.filter_groups and grpo.filter_groups(filter_values(c.filter_metric, group),
                                                          c.group_size).num_dropped == 1:
                    spare.append(group)
                elif len(kept) < stop - first:
                    kept.append(group)
            rounds += 1
            if not c.filter_groups or rounds >= c.max_sample_rounds or not any_process(len(kept) < stop - first):
                break
        # Sampling rounds ran out: fill the share with the dropped groups, masked out so they only pad the shape.
        padding = spare[: stop - first - len(kept)]
        for group in padding:
            group["mask"], group["padding"] = np.zeros_like(group["mask"]), True
            group["later"] = [{**row, "mask": np.zeros_like(row["mask"])} for row in group.get("later", ())]
        collected = {**tally, "groups": kept + padding, "num_padding": len(padding), "rounds": rounds,
                     "groups_filtered": len(spare)}
        if distributed.count() > 1:
            return gathered_collection(collected)
        return {**collected, **{name: np.asarray(tally[name], np.float64)
                                for name in ("sampled_rewards", "final_rewards", "overlong_penalty")}}

    def _sample_round(self, rng: jax.Array, first: int, stop: int, tally: dict) -> list[dict]:
        """One round: this process's prompts of the next batch, group_size answers each, scored; counted in
        `tally` (everything sampled, whether kept or not)."""
        c = self.config
        indices = self.data.take(c.batch_prompts)[first:stop]
        resets = self.prefetch.resets(indices)
        self.prefetch.ahead(self.data.peek(c.batch_prompts)[first:stop])
        started = time.perf_counter()
        if max_turns(self.env) > 1:
            groups, tokens = sample_episode_groups(self.policy, self.env, self.model_params(), indices, resets,
                                                   c.group_size, rng, first * c.group_size)
        else:
            groups, tokens = self._sample_answers(indices, resets, rng, first)
        tally["rollout_time"] += time.perf_counter() - started
        tally["sampled_tokens"] += tokens
        for group, (state, _) in zip(groups, resets):
            if c.overlong_buffer:
                penalty = overlong_penalties(c, group["mask"])
                group["rewards"] = group["rewards"] + penalty
                tally["overlong_penalty"].extend(penalty)
            tally["sampled_groups"] += 1
            tally["sampled_rewards"].extend(group["rewards"])
            tally["final_rewards"].extend(
                final_episode_rewards(self.env, group["finals"], group["rewards"]) if "finals" in group
                else final_rewards(self.env, state, group["tokens"], group["mask"], group["rewards"]))
            tally["sampled_infos"].extend(group["infos"])
            tally["sampled_texts"].extend(group["texts"])
            tally["zero_std_groups"] += grpo.filter_groups(group["rewards"], c.group_size).num_dropped == 1
        return groups

    def _sample_answers(self, indices: list[int], resets: list[tuple], rng: jax.Array,
                        first: int) -> tuple[list[dict], int]:
        """One-turn groups: group_size answers per reset, scored; and the tokens sampled."""
        c = self.config
        where = {"first_row": first * c.group_size} if first else {}
        samples = self.policy.sample(self.model_params(), [obs for _, obs in resets], c.group_size, rng, **where)
        groups = []
        for g, (state, obs) in enumerate(resets):
            rows = slice(g * c.group_size, (g + 1) * c.group_size)
            scored = [score(self.env, state, samples.tokens[r], samples.mask[r])
                      for r in range(rows.start, rows.stop)]
            groups.append({"index": indices[g], "obs": obs, "tokens": samples.tokens[rows],
                           "mask": samples.mask[rows], "logprobs": samples.logprobs[rows],
                           "texts": samples.texts[rows], "rewards": np.array([s[0] for s in scored]),
                           "infos": [s[1] for s in scored]})
        return groups, int(samples.mask.sum())

    def _sample_batch(self, step: int) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        """The step's sampled groups and their rewards, masks, tokens and sampler log-probs as batch arrays,
        and the time the update starts from."""
        self.rng, step_rng = jax.random.split(self.rng)
        collected = self._collect(step, step_rng)
        groups = collected["groups"]
        started = time.perf_counter()
        rewards = np.concatenate([g["rewards"] for g in groups]).astype(np.float32)
        mask = np.concatenate([g["mask"] for g in groups]).astype(np.float32)
        tokens = np.concatenate([g["tokens"] for g in groups])
        sampler_logprobs = np.concatenate([g["logprobs"] for g in groups]).astype(np.float32)
        return collected, rewards, mask, tokens, sampler_logprobs, started

    def step(self, step: int) -> dict[str, float]:
        c = self.config
        collected, rewards, mask, tokens, sampler_logprobs, started = self._sample_batch(step)
        groups = collected["groups"]
        real = np.repeat([not g.get("padding", False) for g in groups], c.group_size)
        advantages = np.zeros(len(rewards), np.float32)  # a padding group's: 0 (and its mask is 0)
        advantages[real] = np.asarray(group_advantages(rewards[real], c.group_size, c.scale_rewards,
                                                       leave_one_out=c.algorithm == "rloo"))
        loss_mask = mask
        if c.mask_truncated_completions:  # their reward still counted in the advantages above
            loss_mask = mask * ~grpo.truncated_rows(tokens, mask, self.policy.eos_ids)[:, None]
        micro_batches = []
        for rows in micro_slices(len(tokens), c.micro_batches):
            batch = self.policy.build_batch(group_observations(groups, rows, c.group_size), tokens[rows], mask[rows])
            micro = {"batch": batch, "behaviour": sampler_logprobs[rows], "advantages": advantages[rows],
                     "mask": loss_mask[rows]}
            micro_batches.append({**micro, **self._micro_extra({**micro, "sampler_logprobs": sampler_logprobs[rows]})})
        # a multi-turn episode's later turns: rows of their own (vlmgym.rl.episode_groups); none in one-turn envs
        later, later_sampler, later_mask = later_turn_micro_batches(
            self.policy, groups, advantages, c.group_size, len(tokens) // c.micro_batches, self.policy.eos_ids,
            c.mask_truncated_completions, self._micro_extra)
        micro_batches += later
        sampler_logprobs = np.concatenate([sampler_logprobs, later_sampler])
        loss_mask = np.concatenate([loss_mask, later_mask])
        normalizer = jnp.float32(grpo.aggregation_normalizer(loss_mask, c.loss_aggregation))
        iteration_metrics = []
        for iteration in range(c.num_iterations):
            settings = self._settings(current_as_old=c.old_logprobs == "learner" and iteration == 0)
            grads, auxes = accumulate(partial(self._gradients, normalizer=normalizer, settings=settings),
                                      in_train_mode(micro_batches, self.adapters, step, iteration))
            self.params, self.opt_state, stats = apply_update(self.params, self.opt_state, grads,
                                                              optimizer=self.optimizer, compiles=self.compiles)
            if iteration == 0:
                first_logprobs = first_learner_logprobs(auxes)
                if c.old_logprobs == "learner":
                    for micro, aux in zip(micro_batches, auxes):
                        micro["behaviour"] = aux["logprobs"]
            iteration_metrics.append({**combine_grpo_figures(auxes),
                                      **{k: float(v) for k, v in jax.device_get(stats).items()}})
        return self._finish_step(step, collected, mask, tokens, iteration_metrics, first_logprobs, sampler_logprobs,
                                 np.concatenate([mask, later_mask]) if later else mask, started)

    def _micro_extra(self, micro: dict) -> dict:
        """What a micro-batch needs beyond its rows: the sampler's log-probs for the sampler correction, the
        reference policy's for the KL term."""
        out = {}
        if self.config.sampler_correction != "none":
            out["sampler"] = micro["sampler_logprobs"]
        if self.reference() is not None:
            out["reference"] = policy_logprobs(self.reference(), micro["batch"], policy=self.policy,
                                               compiles=self.compiles)
        return out

    def _finish_step(self, step: int, collected: dict, step_mask: np.ndarray, step_tokens: np.ndarray,
                     iteration_metrics: list[dict], first_logprobs: np.ndarray, sampler_logprobs: np.ndarray,
                     mask: np.ndarray, started: float) -> dict[str, float]:
        """The step's figures: rewards of everything sampled (step_mask, step_tokens: all its groups), the
        update's, and the first learner forward's over the rows it ran (sampler_logprobs, mask)."""
        c = self.config
        groups = collected["groups"]
        update_time = time.perf_counter() - started
        out = self._metrics(collected, step_mask, step_tokens, iteration_metrics)
        statistics = behaviour_statistics(first_logprobs, sampler_logprobs, mask)
        out.update({k: float(v) for k, v in jax.device_get(statistics).items()})
        out["rollout_time_s"] = collected["rollout_time"]
        out["data_wait_s"] = self.prefetch.take_wait()
        out["update_time_s"] = update_time
        out["sample_tokens_per_s"] = collected["sampled_tokens"] / max(collected["rollout_time"], 1e-9)
        out["tokens_per_s"] = float(mask.sum()) * c.num_iterations / max(update_time, 1e-9)
        out["rollout_compile_count"] = float(getattr(self.policy, "compile_count", 0))
        if self.samples_callback is not None and ((step + 1) % c.samples_every == 0 or step == 0):
            self.samples_callback(step + 1, self._sample_rows([g for g in groups if not g.get("padding", False)]))
        return out

    def _metrics(self, collected: dict, mask: np.ndarray, tokens: np.ndarray,
                 iterations: list[dict]) -> dict[str, float]:
        # Rewards over everything sampled this step, dropped groups included: what the policy scores now.
        rewards = collected["sampled_rewards"]
        out = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
               # the same samples at the curriculum's final weights: the headline training curve
               "final_reward_mean": float(collected["final_rewards"].mean()),
               "zero_std_group_share": collected["zero_std_groups"] / collected["sampled_groups"],
               "groups_dropped": float(collected["groups_filtered"]),
               "sample_rounds": float(collected["rounds"]),
               # the evaluate stage's collapse check on the step's samples: near 1, every group answers alike
               "answer_top_share": answer_spread(collected["sampled_texts"])["top_share"]}
        components: dict[str, list[float]] = {}
        for info in collected["sampled_infos"]:
            for name, value in (info.get("reward_components") or {}).items():
                components.setdefault(name, []).append(float(value))
        out.update({f"reward/{name}": float(np.mean(values)) for name, values in sorted(components.items())})
        out.update(part_figures(collected["sampled_infos"], rewards, collected["final_rewards"]))
        out.update(tool_figures(collected["sampled_infos"]))
        if self.config.overlong_buffer:
            out["overlong_penalty"] = float(collected["overlong_penalty"].mean())
        active_rows = mask.sum(axis=1) > 0
        lengths = mask.sum(axis=1)[active_rows]
        out["completion_length"] = float(lengths.mean()) if lengths.size else 0.0
        ended = ~grpo.truncated_rows(tokens, mask, self.policy.eos_ids)
        out["truncated_share"] = float(1.0 - ended[active_rows].mean()) if lengths.size else 0.0
        for name in iterations[0]:
            values = [float(m[name]) for m in iterations]
            # Clip fractions, KL and ratios say most after the last iteration (the first is on-policy).
            out[name] = values[-1] if name in ("clip_fraction_low", "clip_fraction_high", "approx_kl_behaviour",
                                               "ratio_mean", "ratio_max", "ratio_min") else float(np.mean(values))
        if self.config.beta == 0 or not self.reports_kl_to_reference:
            out.pop("kl_to_reference", None)
        return out

    def _sample_rows(self, groups: list[dict]) -> list[dict]:
        # Round-robin over groups, so the table shows many prompts before a second answer to any of them.
        rows = []
        for member in range(self.config.group_size):
            for group in groups:
                if len(rows) == self.config.num_samples:
                    return rows
                if group["obs"] is None:  # sampled by another process: its images are not here
                    continue
                info = group["infos"][member]
                rows.append({"index": group["index"], "images": group["obs"].get("images", []),
                             "answer": group["texts"][member], "reward": float(group["rewards"][member]),
                             "reward_components": dict(info.get("reward_components") or {})})
        return rows


def overlong_penalties(config: TrainParams, mask: np.ndarray) -> np.ndarray:
    """Each answer's soft overlong penalty (train.overlong_buffer), by its length in tokens."""
    return grpo.soft_overlong_penalty(np.asarray(mask).sum(axis=1), config.max_new_tokens, config.overlong_buffer,
                                      config.overlong_penalty)


def filter_values(metric: str, group: dict) -> np.ndarray:
    """What filter_groups checks for spread in a group: its rewards, or one reward component of each answer."""
    if metric == "reward":
        return group["rewards"]
    values = []
    for info in group["infos"]:
        components = info.get("reward_components") or {}
        if metric not in components:
            raise ValueError(f"train.filter_metric={metric!r}: the env's answers carry no such reward component "
                             f"(they report: {', '.join(sorted(components)) or 'none'}; or use reward)")
        values.append(float(components[metric]))
    return np.asarray(values)


def tool_figures(infos: list[dict]) -> dict[str, float]:
    """Multi-turn episodes' tool use (none for one-turn answers): turns per episode, tool calls per episode, and
    the share of calls the tool refused."""
    if not infos or "turns" not in infos[0]:
        return {}
    calls = [call for info in infos for call in info.get("tool_calls", ())]
    return {"episode_turns": float(np.mean([info["turns"] for info in infos])),
            "tool_calls_per_episode": len(calls) / len(infos),
            "tool_call_error_share": sum(not call["ok"] for call in calls) / max(len(calls), 1)}
