"""What the trainers share besides their losses: optimizer and validator set-up, micro-batch slicing, the
adapters' train mode, per-group observations and the per-env figures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from vlmgym.envs.base import PART_KEY, Env, part_metric
from vlmgym.models.qwen3_vl import lora
from vlmgym.models.qwen3_vl.lora import LoRAConfig
from vlmgym.params import SFTParams, TrainParams
from vlmgym.rl.loop import (
    Policy,
    score,
)
from vlmgym.rl.optim import Optimizer, OptimizerConfig, SubsetOptimizer, trainable_mask
from vlmgym.rl.validation import BEST_DIR, ValidationSettings, Validator

SamplesCallback = Callable[[int, list[dict]], None]


def in_train_mode(micro_batches: list[dict], adapters: LoRAConfig | None, step: int, iteration: int = 0) -> list[dict]:
    """The micro-batches of one update as its training forwards see them: each with its LoRA dropout key and rate
    when the adapters have dropout (lora.dropout_inputs), else the same list (no copy on every update)."""
    if adapters is None or adapters.dropout == 0:
        return micro_batches
    return [{**micro, **lora.dropout_inputs(adapters, step, iteration, index)}
            for index, micro in enumerate(micro_batches)]


def scalar_figures(auxes: list[dict]) -> list[dict]:
    """An update's per-micro-batch figures on the host, without the per-token log-probs (rows spread over
    processes)."""
    return jax.device_get([{name: value for name, value in aux.items() if name != "logprobs"} for aux in auxes])


def micro_slices(rows: int, micro_batches: int) -> list[slice]:
    """Row ranges of equal-size micro-batches."""
    if rows % micro_batches:
        raise ValueError(f"batch of {rows} rows does not split into {micro_batches} micro-batches")
    size = rows // micro_batches
    return [slice(i * size, (i + 1) * size) for i in range(micro_batches)]


def group_observations(groups: list, rows: slice, group_size: int) -> list[dict]:
    """The observations of a micro-batch's rows: one per group when it holds whole groups (the policy runs each
    prompt once for its group), else one per row."""
    if rows.start % group_size == 0 and rows.stop % group_size == 0:
        return [g.obs for g in groups[rows.start // group_size: rows.stop // group_size]]
    return [groups[r // group_size].obs for r in range(rows.start, rows.stop)]


def final_rewards(env: Env, state: Any, tokens: np.ndarray, mask: np.ndarray, rewards: np.ndarray) -> list[float]:
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


def make_validator(policy: Policy, val_env: Env | None, config: SFTParams | TrainParams, checkpoint_dir: str | Path, *,
                   extra: Callable | None = None) -> Validator | None:
    """The loop's validator from an sft/train section's val_* settings (None when val_every is 0)."""
    v = config.validation
    settings = ValidationSettings(every=v.every, batch_size=v.batch_size, select=v.select,
                                  early_stop_patience=v.early_stop_patience, seed=config.seed)
    if settings.every == 0:
        return None
    if val_env is None:
        raise ValueError(f"validation.every={v.every} needs a validation env (the val split)")
    return Validator(policy, val_env, settings, Path(checkpoint_dir) / BEST_DIR, extra=extra)


def optimizer_config(section: SFTParams | TrainParams) -> OptimizerConfig:
    """The optimizer settings of an sft or train params section.

    The schedule counts optimizer updates, and a GRPO step makes `num_iterations` of them, so its warmup and
    length are the section's step counts times that: the cosine ends at the last step, not after 1/num_iterations
    of the run."""
    updates_per_step = getattr(section, "num_iterations", 1)
    opt = section.optimizer
    return OptimizerConfig(learning_rate=opt.lr, warmup_steps=opt.warmup_steps * updates_per_step,
                           total_steps=section.steps * updates_per_step, end_lr_ratio=opt.end_lr_ratio,
                           weight_decay=opt.weight_decay, max_grad_norm=opt.max_grad_norm)


def make_optimizer(section: SFTParams | TrainParams, params: Any) -> Optimizer | SubsetOptimizer:
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


def adapter_settings(section: SFTParams | TrainParams, params: Any) -> LoRAConfig | None:
    """The section's LoRA settings when `params` hold adapters (their dropout applies to training forwards)."""
    return LoRAConfig.from_section(section.lora) if lora.has_adapters(params) else None
