"""What the online algorithms' loops share (GRPO/RLOO, PPO, online DPO): every step samples a batch of scored groups
(vlmgym.rl.sampling) and hands it to the algorithm's own update; the optimizer, the start policy as reference,
checkpoints, validation and the step's figures are common. Each algorithm's trainer subclasses OnlineTrainer
alone and says what it needs as arguments (its algorithms, the policy it holds as reference)."""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.envs.base import Env
from vlmgym.models.qwen3_vl import lora
from vlmgym.params import TrainParams
from vlmgym.rl.loop import DataOrder, MetricsCallback, Policy, TrainingLoop
from vlmgym.rl.multiprocess import check_multiprocess
from vlmgym.rl.objective import LAST_ITERATION
from vlmgym.rl.sampling import Batch, Sampler, sample_rows, sampled_figures
from vlmgym.rl.trainer_parts import SamplesCallback, adapter_settings, make_optimizer, make_validator
from vlmgym.rl.update import behaviour_statistics
from vlmgym.runtime import distributed


@dataclass(frozen=True)
class Update:
    """What an algorithm's update of one step reports."""

    iterations: list[dict[str, float]]  # the figures of each of its num_iterations optimizer steps
    first_logprobs: np.ndarray  # the first learner forward's log-probs of the rows it trained
    sampler_logprobs: np.ndarray  # the sampler's log-probs of those rows
    mask: np.ndarray  # their mask
    figures: dict[str, float] = field(default_factory=dict)  # the algorithm's own figures of the step


class OnlineTrainer(TrainingLoop):
    """Sample a batch, update, checkpoint: the loop of every online algorithm, whose trainer provides `update`.

    The trainer takes ownership of `params`: their buffers are donated to the first update (no second copy of
    the model in memory), so the caller must not use them afterwards; `trainer.params` holds the current ones.
    `reference_of`: the start policy's params when the algorithm compares with it (a frozen copy is held; with LoRA
    the base inside the trained tree serves, no copy), else None.
    """

    def __init__(self, policy: Policy, env: Env, params: Any, config: TrainParams, checkpoint_dir: str | Path, *,
                 algorithms: tuple[str, ...], reference_of: Any = None,
                 metrics_callback: MetricsCallback | None = None, samples_callback: SamplesCallback | None = None,
                 progress_bar: bool = True, val_env: Env | None = None):
        super().__init__(total_steps=config.steps, checkpoint_dir=checkpoint_dir, save_every=config.checkpointing.every,
                         keep=config.checkpointing.keep, metrics_callback=metrics_callback, progress_bar=progress_bar)
        self.validator = make_validator(policy, val_env, config, checkpoint_dir)
        if (config.batch_prompts * config.group_size) % config.micro_batches:
            raise ValueError(f"train: {config.batch_prompts} x {config.group_size} sequences do not split into "
                             f"micro_batches={config.micro_batches}")
        if config.algorithm not in algorithms:
            raise ValueError(f"train: {type(self).__name__} runs train.algorithm {' or '.join(algorithms)}, "
                             f"not {config.algorithm!r} (vlmgym.rl.stage_setup.TRAINERS picks the trainer)")
        self.sampler = Sampler(policy, env, config)
        self.policy, self.env, self.config = policy, env, config
        self.samples_callback = samples_callback
        self.optimizer = make_optimizer(config, params)
        self.adapters = adapter_settings(config, params)
        self.reference_is_base = reference_of is not None and lora.has_adapters(reference_of)
        self.reference_params = (jax.tree.map(jnp.copy, reference_of)
                                 if reference_of is not None and not self.reference_is_base else None)
        self.params, self.opt_state = params, self.optimizer.init_placed(params)
        self.rng = jax.random.key(config.seed)
        if distributed.count() > 1:
            check_multiprocess(config, policy)

    @abc.abstractmethod
    def update(self, step: int, batch: Batch) -> Update:
        """The algorithm's num_iterations optimizer steps on the step's batch (they set self.params and
        self.opt_state)."""

    def step(self, step: int) -> dict[str, float]:
        self.rng, step_rng = jax.random.split(self.rng)
        batch = self.sampler.batch(self.model_params(), step / self.total_steps, step_rng)
        started = time.perf_counter()
        update = self.update(step, batch)
        return self._figures(step, batch, update, time.perf_counter() - started)

    def reference(self) -> Any:
        """The frozen reference policy's params (None when none is held)."""
        return lora.strip(self.model_params()) if self.reference_is_base else self.reference_params

    def loop_state(self) -> dict:
        return {"data": self.sampler.data.state()}

    def load_loop_state(self, state: dict) -> None:
        self.sampler.data = DataOrder.from_state(len(self.env), self.config.seed, state["data"])

    def close(self) -> None:
        self.sampler.close()

    def _figures(self, step: int, batch: Batch, update: Update, update_time: float) -> dict[str, float]:
        """The step's figures: rewards of everything sampled, the update's, and the first learner forward's over
        the rows it trained."""
        c = self.config
        out = {**sampled_figures(batch, self.policy.eos_ids, bool(c.objective.overlong_buffer)),
               **iteration_figures(update.iterations)}
        statistics = behaviour_statistics(update.first_logprobs, update.sampler_logprobs, update.mask)
        out.update({k: float(v) for k, v in jax.device_get(statistics).items()})
        sampled = batch.sampled
        out["rollout_time_s"] = sampled.rollout_time
        out["data_wait_s"] = self.sampler.prefetch.take_wait()
        out["update_time_s"] = update_time
        out["sample_tokens_per_s"] = sampled.tokens / max(sampled.rollout_time, 1e-9)
        out["tokens_per_s"] = float(update.mask.sum()) * c.num_iterations / max(update_time, 1e-9)
        out["rollout_compile_count"] = float(getattr(self.policy, "compile_count", 0))
        if self.samples_callback is not None and ((step + 1) % c.samples_every == 0 or step == 0):
            self.samples_callback(step + 1, sample_rows(batch.groups, c.group_size, c.num_samples))
        return {**out, **update.figures}


def iteration_figures(iterations: list[dict[str, float]]) -> dict[str, float]:
    """A step's update figures from its iterations': the last iteration's where it says most, else the mean."""
    out = {}
    for name in iterations[0]:
        values = [float(m[name]) for m in iterations]
        out[name] = values[-1] if name in LAST_ITERATION else float(np.mean(values))
    return out
