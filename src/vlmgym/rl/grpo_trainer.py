"""GRPO and SFT training loops over an env and a Policy, with exact resume and per-step metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym import distributed
from vlmgym.envs.base import PART_KEY, part_metric
from vlmgym.eval.metrics import answer_spread
from vlmgym.models.qwen3_vl import lora
from vlmgym.models.qwen3_vl.lora import LoRAConfig
from vlmgym.rl import dpo, grpo
from vlmgym.rl.loop import (
    CompileCounter,
    DataOrder,
    MetricsCallback,
    Policy,
    TrainingLoop,
    score,
)
from vlmgym.rl.multiprocess import check_multiprocess, gathered_collection
from vlmgym.rl.optim import Optimizer, OptimizerConfig, SubsetOptimizer, trainable_mask
from vlmgym.rl.prefetch import ResetPrefetcher
from vlmgym.rl.sft import sft_loss_from_logprobs
from vlmgym.rl.validation import BEST_DIR, ValidationSettings, Validator

SamplesCallback = Callable[[int, list[dict]], None]


@dataclass(frozen=True)
class LossSettings:
    """Static settings of the jitted GRPO update (hashable)."""

    epsilon: float
    epsilon_high: float
    aggregation: str
    beta: float
    current_as_old: bool  # behaviour log-probs = this forward's own (stop-gradient) log-probs: ratio exactly 1


def _grpo_micro_loss(params: Any, micro: dict, normalizer: jax.Array, policy: Policy,
                     settings: LossSettings) -> tuple[jax.Array, dict]:
    logprobs = policy.logprobs(params, micro["batch"])
    behaviour = jax.lax.stop_gradient(logprobs) if settings.current_as_old else micro["behaviour"]
    out = grpo.grpo_loss(logprobs, behaviour, micro["advantages"], micro["mask"], epsilon=settings.epsilon,
                         epsilon_high=settings.epsilon_high, aggregation=settings.aggregation, beta=settings.beta,
                         reference_logprobs=micro.get("reference"), normalizer=normalizer)
    tokens = micro["mask"].astype(jnp.float32).sum()
    # Per-micro-batch means become sums here and are divided by the batch's token count afterwards.
    aux = {"logprobs": jax.lax.stop_gradient(logprobs), "tokens": tokens,
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
    return _fp32_gradients(_grpo_micro_loss, params, micro, normalizer, optimizer, policy, settings)


def _fp32_gradients(micro_loss: Callable, params: Any, micro: dict, normalizer: jax.Array, optimizer: Optimizer,
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
    return _fp32_gradients(_dpo_micro_loss, params, micro, normalizer, optimizer, policy, beta)


def _combine_dpo_figures(auxes: list[dict], pairs: int) -> dict[str, float]:
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


def _first_logprobs(auxes: list[dict]) -> np.ndarray:
    """The first learner forward's per-token log-probs of every row, on this host."""
    return np.concatenate([distributed.host_value(aux["logprobs"]) for aux in auxes])


def _combine_grpo_figures(auxes: list[dict]) -> dict[str, float]:
    """Whole-batch figures from per-micro-batch sums (host side)."""
    auxes = _scalar_figures(auxes)
    tokens = max(sum(float(a["tokens"]) for a in auxes), 1.0)
    out = {name: sum(float(a[name]) for a in auxes) for name in ("loss", "policy_loss", "kl_to_reference")}
    for name in ("clip_fraction_low", "clip_fraction_high", "approx_kl_behaviour", "ratio_mean"):
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
def _advantages(rewards: jax.Array, group_size: int, scale_rewards: str, leave_one_out: bool = False) -> jax.Array:
    return grpo.group_advantages(rewards, group_size, scale_rewards, leave_one_out=leave_one_out)


@jax.jit
def _behaviour_statistics(learner_logprobs: jax.Array, sampler_logprobs: jax.Array, mask: jax.Array) -> dict:
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
    return _fp32_gradients(_sft_micro_loss, params, micro, normalizer, optimizer, policy)


def in_train_mode(micro_batches: list[dict], adapters: LoRAConfig | None, step: int, iteration: int = 0) -> list[dict]:
    """The micro-batches of one update as its training forwards see them: each with its LoRA dropout key and rate
    when the adapters have dropout (lora.dropout_inputs), else the same list (no copy on every update)."""
    if adapters is None or adapters.dropout == 0:
        return micro_batches
    return [{**micro, **lora.dropout_inputs(adapters, step, iteration, index)}
            for index, micro in enumerate(micro_batches)]


def micro_slices(rows: int, micro_batches: int) -> list[slice]:
    """Row ranges of equal-size micro-batches."""
    if rows % micro_batches:
        raise ValueError(f"batch of {rows} rows does not split into {micro_batches} micro-batches")
    size = rows // micro_batches
    return [slice(i * size, (i + 1) * size) for i in range(micro_batches)]


def group_observations(groups: list[dict], rows: slice, group_size: int) -> list[dict]:
    """The observations of a micro-batch's rows: one per group when it holds whole groups (the policy runs each
    prompt once for its group), else one per row."""
    if rows.start % group_size == 0 and rows.stop % group_size == 0:
        return [g["obs"] for g in groups[rows.start // group_size: rows.stop // group_size]]
    return [groups[r // group_size]["obs"] for r in range(rows.start, rows.stop)]


def final_rewards(env: Any, state: Any, tokens: np.ndarray, mask: np.ndarray, rewards: np.ndarray) -> list[float]:
    """The rewards of completions at training progress 1 (a curriculum's final weights): the fixed yardstick a
    training curve is read against, since the reward at the current progress shifts as the curriculum moves.
    `rewards` are theirs at the current progress, reused (not scored again) once that is 1."""
    progress = env.progress
    if progress >= 1.0:
        return [float(r) for r in rewards]
    env.set_progress(1.0)
    try:
        return [score(env, state, t, m)[0] for t, m in zip(tokens, mask)]
    finally:
        env.set_progress(progress)


def part_figures(infos: list[dict], rewards: np.ndarray, final: np.ndarray) -> dict[str, float]:
    """Per sub-env figures of a step's answers, for an env made of several (infos naming their sub-env under
    PART_KEY; none for any other env): each one's share of the answers, its mean reward (as trained and at the
    final curriculum weights) and its reward components' means, as env/<name>/<figure> (part_metric)."""
    groups: dict[str, list[int]] = {}
    for row, info in enumerate(infos):
        if info.get(PART_KEY) is not None:
            groups.setdefault(str(info[PART_KEY]), []).append(row)
    out: dict[str, float] = {}
    for part, rows in sorted(groups.items()):
        out[part_metric(part, "share")] = len(rows) / len(infos)
        out[part_metric(part, "reward_mean")] = float(np.mean(rewards[rows]))
        out[part_metric(part, "final_reward_mean")] = float(np.mean(final[rows]))
        components: dict[str, list[float]] = {}
        for row in rows:
            for name, value in (infos[row].get("reward_components") or {}).items():
                components.setdefault(name, []).append(float(value))
        out.update({part_metric(part, f"reward/{name}"): float(np.mean(values))
                    for name, values in sorted(components.items())})
    return out


def make_validator(policy: Policy, val_env: Any, config: Any, checkpoint_dir: str | Path, *,
                   extra: Callable | None = None) -> Validator | None:
    """The loop's validator from an sft/train section's val_* settings (None when val_every is 0)."""
    settings = ValidationSettings(every=config.val_every, batch_size=config.val_batch_size, select=config.select,
                                  early_stop_patience=config.early_stop_patience, seed=config.seed)
    if settings.every == 0:
        return None
    if val_env is None:
        raise ValueError(f"val_every={config.val_every} needs a validation env (the val split)")
    return Validator(policy, val_env, settings, Path(checkpoint_dir) / BEST_DIR, extra=extra)


def optimizer_config(section: Any) -> OptimizerConfig:
    """The optimizer settings of an sft or train params section.

    The schedule counts optimizer updates, and a GRPO step makes `num_iterations` of them, so its warmup and
    length are the section's step counts times that: the cosine ends at the last step, not after 1/num_iterations
    of the run."""
    updates_per_step = getattr(section, "num_iterations", 1)
    return OptimizerConfig(learning_rate=section.lr, warmup_steps=section.warmup_steps * updates_per_step,
                           total_steps=section.steps * updates_per_step, end_lr_ratio=section.end_lr_ratio,
                           weight_decay=section.weight_decay, max_grad_norm=section.max_grad_norm)


def make_optimizer(section: Any, params: Any) -> Optimizer | SubsetOptimizer:
    """The optimizer of an sft or train section: over the LoRA adapters alone when `params` holds adapters (plus a
    PPO value head), else over every leaf `section.freeze` leaves trainable."""
    if not lora.has_adapters(params):
        return Optimizer(optimizer_config(section), trainable_mask(params, section.freeze))
    if section.freeze != "none":
        raise ValueError(f"freeze={section.freeze!r} with LoRA: the base is frozen whole already (lora.vision "
                         "says whether the vision tower gets adapters)")
    mask = lora.trainable_mask(params)
    if "value" in params:  # PPO's value head is trained in full beside the adapters
        mask = {**mask, "value": jax.tree.map(lambda _: True, params["value"])}
    return SubsetOptimizer(optimizer_config(section), mask)


def adapter_settings(section: Any, params: Any) -> LoRAConfig | None:
    """The section's LoRA settings when `params` hold adapters (their dropout applies to training forwards)."""
    return LoRAConfig.from_section(getattr(section, "lora", None)) if lora.has_adapters(params) else None


class GRPOTrainer(TrainingLoop):
    """GRPO: sample groups, score them with the env, update with the clipped surrogate, checkpoint.

    The trainer takes ownership of `params`: their buffers are donated to the first update (no second copy of
    the model in memory), so the caller must not use them afterwards; `trainer.params` holds the current ones.
    """

    name = "grpo"

    def __init__(self, policy: Policy, env: Any, params: Any, config: Any, checkpoint_dir: str | Path, *,
                 metrics_callback: MetricsCallback | None = None, samples_callback: SamplesCallback | None = None,
                 progress_bar: bool = True, val_env: Any = None):
        super().__init__(total_steps=config.steps, checkpoint_dir=checkpoint_dir, save_every=config.save_every,
                         keep=config.keep_checkpoints, metrics_callback=metrics_callback, progress_bar=progress_bar)
        self.validator = make_validator(policy, val_env, config, checkpoint_dir)
        if (config.batch_prompts * config.group_size) % config.micro_batches:
            raise ValueError(f"train: {config.batch_prompts} x {config.group_size} sequences do not split into "
                             f"micro_batches={config.micro_batches}")
        self.policy, self.env, self.config = policy, env, config
        self.samples_callback = samples_callback
        self.optimizer = make_optimizer(config, params)
        self.adapters = adapter_settings(config, params)
        if config.algorithm == "dpo" and config.batch_prompts % config.micro_batches:
            raise ValueError(f"train: dpo splits its {config.batch_prompts} pairs into micro_batches="
                             f"{config.micro_batches}, which must divide them")
        # The reference policy is a frozen copy of the starting params, held only when the KL term is on (GRPO)
        # or DPO needs it.
        holds_reference = config.beta > 0 or config.algorithm == "dpo"
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
        if self.config.algorithm == "dpo":
            return {"reward": f"{metrics['reward_mean']:.3f}", "margin": f"{metrics['dpo_margin']:.3f}"}
        return {"reward": f"{metrics['reward_mean']:.3f}", "kl": f"{metrics['approx_kl_behaviour']:.2e}"}

    def _gradients(self, micro: dict, normalizer: jax.Array, settings: LossSettings) -> tuple:
        return grpo_gradients(self.params, micro, normalizer, policy=self.policy, optimizer=self.optimizer,
                              settings=settings, compiles=self.compiles)

    def _settings(self, current_as_old: bool) -> LossSettings:
        c = self.config
        return LossSettings(epsilon=c.epsilon, epsilon_high=c.epsilon_high, aggregation=c.loss_aggregation,
                            beta=c.beta, current_as_old=current_as_old)

    def _collect(self, step: int, rng: jax.Array) -> dict:
        """Sample and score groups until the batch is full (dropping all-equal groups when filtering)."""
        c = self.config
        # The curriculum follows training progress, not env resets (which sampling rounds would skew).
        self.env.set_progress(step / self.total_steps)
        kept, spare, sampled_rewards, sampled_infos, sampled_texts, final = [], [], [], [], [], []
        sampled_groups = zero_std_groups = rounds = sampled_tokens = 0
        rollout_time = 0.0
        # Each process samples its share of the step's prompts (all of them in a single-process run).
        first, stop = distributed.local_range(c.batch_prompts)
        while len(kept) < c.batch_prompts and rounds < c.max_sample_rounds:
            indices = self.data.take(c.batch_prompts)[first:stop]
            resets = self.prefetch.resets(indices)
            self.prefetch.ahead(self.data.peek(c.batch_prompts)[first:stop])
            observations = [obs for _, obs in resets]
            started = time.perf_counter()
            where = {"first_row": first * c.group_size} if first else {}
            samples = self.policy.sample(self.model_params(), observations, c.group_size,
                                         jax.random.fold_in(rng, rounds), **where)
            rollout_time += time.perf_counter() - started
            sampled_tokens += int(samples.mask.sum())
            rounds += 1
            for g, (state, obs) in enumerate(resets):
                rows = range(g * c.group_size, (g + 1) * c.group_size)
                scored = [score(self.env, state, samples.tokens[r], samples.mask[r]) for r in rows]
                group = {"index": indices[g], "obs": obs, "tokens": samples.tokens[rows.start:rows.stop],
                         "mask": samples.mask[rows.start:rows.stop], "logprobs": samples.logprobs[rows.start:rows.stop],
                         "texts": samples.texts[rows.start:rows.stop], "rewards": np.array([s[0] for s in scored]),
                         "infos": [s[1] for s in scored]}
                sampled_groups += 1
                sampled_rewards.extend(group["rewards"])
                final.extend(final_rewards(self.env, state, group["tokens"], group["mask"], group["rewards"]))
                sampled_infos.extend(group["infos"])
                sampled_texts.extend(group["texts"])
                equal = grpo.filter_groups(group["rewards"], c.group_size).num_dropped == 1
                zero_std_groups += equal
                if c.filter_groups and equal:
                    spare.append(group)
                elif len(kept) < c.batch_prompts:
                    kept.append(group)
            if not c.filter_groups:
                break
        if distributed.count() > 1:
            return gathered_collection(kept, rollout_time, sampled_tokens, final)
        # Sampling rounds ran out: fill the batch with all-equal groups, masked out so they only pad the shape.
        padding = spare[: c.batch_prompts - len(kept)]
        for group in padding:
            group["mask"] = np.zeros_like(group["mask"])
        return {"groups": kept + padding, "num_padding": len(padding), "sampled_groups": sampled_groups,
                "zero_std_groups": zero_std_groups, "rounds": rounds, "rollout_time": rollout_time,
                "sampled_tokens": sampled_tokens, "sampled_rewards": np.asarray(sampled_rewards, np.float64),
                "final_rewards": np.asarray(final, np.float64),
                "sampled_infos": sampled_infos, "sampled_texts": sampled_texts}

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
        if c.algorithm == "dpo":
            return self._finish_step(step, collected, mask, tokens, *self._dpo_updates(
                step, groups, rewards, mask, tokens, sampler_logprobs), started)
        real = np.repeat([i < len(groups) - collected["num_padding"] for i in range(len(groups))], c.group_size)
        advantages = np.asarray(_advantages(rewards[real], c.group_size, c.scale_rewards,
                                            leave_one_out=c.algorithm == "rloo"))
        advantages = np.concatenate([advantages, np.zeros(int((~real).sum()), np.float32)])
        normalizer = jnp.float32(grpo.aggregation_normalizer(mask, c.loss_aggregation))
        micro_batches = []
        for rows in micro_slices(len(tokens), c.micro_batches):
            batch = self.policy.build_batch(group_observations(groups, rows, c.group_size), tokens[rows], mask[rows])
            micro = {"batch": batch, "behaviour": sampler_logprobs[rows], "advantages": advantages[rows],
                     "mask": mask[rows]}
            if self.reference() is not None:
                micro["reference"] = policy_logprobs(self.reference(), batch, policy=self.policy,
                                                     compiles=self.compiles)
            micro_batches.append(micro)
        iteration_metrics = []
        for iteration in range(c.num_iterations):
            settings = self._settings(current_as_old=c.old_logprobs == "learner" and iteration == 0)
            grads, auxes = accumulate(partial(self._gradients, normalizer=normalizer, settings=settings),
                                      in_train_mode(micro_batches, self.adapters, step, iteration))
            self.params, self.opt_state, stats = apply_update(self.params, self.opt_state, grads,
                                                              optimizer=self.optimizer, compiles=self.compiles)
            if iteration == 0:
                first_logprobs = _first_logprobs(auxes)
                if c.old_logprobs == "learner":
                    for micro, aux in zip(micro_batches, auxes):
                        micro["behaviour"] = aux["logprobs"]
            iteration_metrics.append({**_combine_grpo_figures(auxes),
                                      **{k: float(v) for k, v in jax.device_get(stats).items()}})
        return self._finish_step(step, collected, mask, tokens, iteration_metrics, first_logprobs, sampler_logprobs,
                                 mask, started)

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
                              beta=c.dpo_beta, compiles=self.compiles)
        iteration_metrics = []
        for iteration in range(c.num_iterations):
            grads, auxes = accumulate(lambda micro: gradient_fn(self.params, micro),
                                      in_train_mode(micro_batches, self.adapters, step, iteration))
            self.params, self.opt_state, stats = apply_update(self.params, self.opt_state, grads,
                                                              optimizer=self.optimizer, compiles=self.compiles)
            if iteration == 0:
                first_logprobs = _first_logprobs(auxes)
            iteration_metrics.append({**_combine_dpo_figures(auxes, valid_pairs), "dpo_pairs": float(valid_pairs),
                                      **{k: float(v) for k, v in jax.device_get(stats).items()}})
        return iteration_metrics, first_logprobs, sampler_logprobs[rows], pair_mask

    def _finish_step(self, step: int, collected: dict, step_mask: np.ndarray, step_tokens: np.ndarray,
                     iteration_metrics: list[dict], first_logprobs: np.ndarray, sampler_logprobs: np.ndarray,
                     mask: np.ndarray, started: float) -> dict[str, float]:
        """The step's figures: rewards of everything sampled (step_mask, step_tokens: all its groups), the
        update's, and the first learner forward's over the rows it ran (sampler_logprobs, mask)."""
        c = self.config
        groups = collected["groups"]
        update_time = time.perf_counter() - started
        out = self._metrics(collected, step_mask, step_tokens, iteration_metrics)
        statistics = _behaviour_statistics(first_logprobs, sampler_logprobs, mask)
        out.update({k: float(v) for k, v in jax.device_get(statistics).items()})
        out["rollout_time_s"] = collected["rollout_time"]
        out["data_wait_s"] = self.prefetch.take_wait()
        out["update_time_s"] = update_time
        out["sample_tokens_per_s"] = collected["sampled_tokens"] / max(collected["rollout_time"], 1e-9)
        out["tokens_per_s"] = float(mask.sum()) * c.num_iterations / max(update_time, 1e-9)
        out["rollout_compile_count"] = float(getattr(self.policy, "compile_count", 0))
        if self.samples_callback is not None and ((step + 1) % c.samples_every == 0 or step == 0):
            self.samples_callback(step + 1, self._sample_rows(groups[: len(groups) - collected["num_padding"]]))
        return out

    def _metrics(self, collected: dict, mask: np.ndarray, tokens: np.ndarray,
                 iterations: list[dict]) -> dict[str, float]:
        # Rewards over everything sampled this step, dropped groups included: what the policy scores now.
        rewards = collected["sampled_rewards"]
        out = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
               # the same samples at the curriculum's final weights: the headline training curve
               "final_reward_mean": float(collected["final_rewards"].mean()),
               "zero_std_group_share": collected["zero_std_groups"] / collected["sampled_groups"],
               "groups_dropped": float(collected["zero_std_groups"] if self.config.filter_groups else 0),
               "sample_rounds": float(collected["rounds"]),
               # the evaluate stage's collapse check on the step's samples: near 1, every group answers alike
               "answer_top_share": answer_spread(collected["sampled_texts"])["top_share"]}
        components: dict[str, list[float]] = {}
        for info in collected["sampled_infos"]:
            for name, value in (info.get("reward_components") or {}).items():
                components.setdefault(name, []).append(float(value))
        out.update({f"reward/{name}": float(np.mean(values)) for name, values in sorted(components.items())})
        out.update(part_figures(collected["sampled_infos"], rewards, collected["final_rewards"]))
        active_rows = mask.sum(axis=1) > 0
        lengths = mask.sum(axis=1)[active_rows]
        out["completion_length"] = float(lengths.mean()) if lengths.size else 0.0
        eos = np.isin(tokens, self.policy.eos_ids) & (mask > 0)
        out["truncated_share"] = float(1.0 - eos.any(axis=1)[active_rows].mean()) if lengths.size else 0.0
        for name in iterations[0]:
            values = [float(m[name]) for m in iterations]
            # Clip fractions, KL and ratios say most after the last iteration (the first is on-policy).
            out[name] = values[-1] if name in ("clip_fraction_low", "clip_fraction_high", "approx_kl_behaviour",
                                               "ratio_mean", "ratio_max", "ratio_min") else float(np.mean(values))
        if self.config.beta == 0 or self.config.algorithm not in ("grpo", "rloo"):
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


class SFTTrainer(TrainingLoop):
    """Supervised warm start: teacher-forced cross entropy on the env's ideal answer for each sample.

    Like GRPOTrainer it takes ownership of `params` (donated to the first update).
    """

    name = "sft"

    def __init__(self, policy: Policy, env: Any, params: Any, config: Any, checkpoint_dir: str | Path, *,
                 metrics_callback: MetricsCallback | None = None, progress_bar: bool = True, val_env: Any = None):
        super().__init__(total_steps=config.steps, checkpoint_dir=checkpoint_dir, save_every=config.save_every,
                         keep=config.keep_checkpoints, metrics_callback=metrics_callback, progress_bar=progress_bar)
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

    def loop_state(self) -> dict:
        return {"data": self.data.state()}

    def load_loop_state(self, state: dict) -> None:
        self.data = DataOrder.from_state(len(self.env), self.config.seed, state["data"])

    def validation_loss(self, params: Any) -> dict[str, float]:
        """Teacher-forced loss on the val split's ideal answers (batches padded to batch_size: one compile)."""
        env, size = self.validator.env, self.config.batch_size
        total = count = 0.0
        for start in range(0, len(env), size):
            observations, rows = [], []
            for index in range(start, min(start + size, len(env))):
                state, obs = env.reset(index)
                try:
                    rows.append(self.policy.encode_targets([env.sft_target(state.meta)]))
                except ValueError:
                    continue  # too long for the budget: skipped in training too
                observations.append(obs)
            if not rows:
                continue
            padding = size - len(rows)
            tokens = np.concatenate([t for t, _ in rows] + [rows[-1][0]] * padding)
            mask = np.concatenate([m for _, m in rows] + [np.zeros_like(rows[-1][1])] * padding)
            batch = self.policy.build_batch(observations + [observations[-1]] * padding, tokens, mask)
            logprobs = np.asarray(policy_logprobs(params, batch, policy=self.policy, compiles=self.compiles))
            total -= float((logprobs * mask).sum())
            count += float(mask.sum())
        return {"val/loss": total / max(count, 1.0)}

    def step(self, step: int) -> dict[str, float]:
        observations, rows, skipped = [], [], 0
        while len(rows) < self.config.batch_size:
            for state, obs in self.prefetch.resets(self.data.take(self.config.batch_size - len(rows))):
                try:
                    rows.append(self.policy.encode_targets([self.env.sft_target(state.meta)]))
                except ValueError:
                    # A target longer than the token budget would teach an answer without its end: skip it.
                    skipped += 1
                    if skipped > 10 * self.config.batch_size:
                        raise
                    continue
                observations.append(obs)
        self.prefetch.ahead(self.data.peek(self.config.batch_size))
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
        out["target_length"] = float(mask.sum(axis=1).mean())
        out["targets_skipped"] = float(skipped)
        return out
