"""Evaluation rollouts: a JAX policy answers every sample of an env split, in batches, as rollout records.

    engine, params = load_engine("models/jax/grpo", max_new_tokens=64)             # greedy
    records, timing = answer_split(engine, params, env, policy="grpo", batch_size=16)

Each record is `vlmgym.eval.records.rollout_record(...)` plus the engine's output for the answer:
`tokens` (completion ids through the first end-of-turn token), `finish_reason` ("eos" or "length") and, for
sampled answers, `sample` (0 .. group_size - 1). The env scores the same tokens the trainer would score.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from vlmgym.eval.blind import blank_observation
from vlmgym.eval.records import rollout_record


@dataclass(frozen=True)
class RolloutTiming:
    """How long answering took; `steady` figures leave out the first batch, which includes the jit compile."""

    samples: int
    answers: int
    generated_tokens: int
    seconds: float
    steady_tokens: int
    steady_seconds: float

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second after the first batch (over all batches when there is only one)."""
        if self.steady_seconds > 0:
            return self.steady_tokens / self.steady_seconds
        return self.generated_tokens / max(self.seconds, 1e-9)

    def counts(self) -> dict[str, float]:
        """What was answered: the same on every run, so it may go into DVC outputs."""
        return {"samples": self.samples, "answers": self.answers, "generated_tokens": self.generated_tokens}

    def speed(self) -> dict[str, float]:
        """How fast: different on every run, so it goes to MLflow only (a DVC output holding it would change its
        hash on every run and leave dvc.lock modified after a rerun that changed nothing)."""
        return {"seconds": self.seconds, "tokens_per_s": self.tokens_per_s}


def load_engine(model_dir: str | Path, *, max_new_tokens: int, dtype: str = "fp32", param_dtype: str = "fp32",
                greedy: bool = True, temperature: float = 1.0) -> tuple[Any, Any]:
    """(RolloutEngine, params) for a vlmgym JAX model folder; greedy, or plain sampling at `temperature`."""
    from vlmgym.models.qwen3_vl.convert import load_checkpoint
    from vlmgym.models.qwen3_vl.processor import Processor
    from vlmgym.rollout import RolloutEngine, SamplingSettings

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"{model_dir}: no model folder (did the stage that writes it run?)")
    processor = Processor.from_pretrained(model_dir)
    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy,
                                eos_ids=tuple(processor.eos_token_ids), pad_id=int(processor.pad_token_id))
    cfg, params = load_checkpoint(model_dir, dtype=dtype, param_dtype=param_dtype)
    return RolloutEngine(cfg, processor, settings), params


def _batches(count: int, batch_size: int) -> list[range]:
    return [range(start, min(start + batch_size, count)) for start in range(0, count, batch_size)]


def answer_split(engine: Any, params: Any, env: Any, *, policy: str, batch_size: int, group_size: int = 1,
                 key: jax.Array | None = None, indices: Sequence[int] | None = None,
                 show_progress: bool = True, blank_images: bool = False) -> tuple[list[dict[str, Any]], RolloutTiming]:
    """group_size answers per env sample (all samples unless `indices`), as rollout records in sample order;
    `blank_images` shows every image as a grey image of its size (the text-only baseline, vlmgym.eval.blind).

    Every batch is padded to `batch_size` prompts by repeating its last prompt (those answers are dropped), so
    the engine compiles once per run instead of once more for a short last batch.
    """
    if batch_size < 1 or group_size < 1:
        raise ValueError(f"batch_size and group_size must be >= 1, got {batch_size}, {group_size}")
    if group_size > 1 and key is None:
        raise ValueError("sampled answers (group_size > 1) need a random key")
    key = jax.random.key(0) if key is None else key
    indices = list(range(len(env))) if indices is None else [int(i) for i in indices]
    records: list[dict[str, Any]] = []
    generated = steady_tokens = 0
    seconds = steady_seconds = 0.0
    bar = tqdm(total=len(indices), desc=f"rollout {policy}", unit="sample", disable=not show_progress,
               dynamic_ncols=True)
    try:
        for number, rows in enumerate(_batches(len(indices), batch_size)):
            resets = [env.reset(indices[i]) for i in rows]
            observations = [blank_observation(obs) if blank_images else obs for _, obs in resets]
            observations += [observations[-1]] * (batch_size - len(observations))
            started = time.perf_counter()
            batch = engine.generate(params, observations, group_size, jax.random.fold_in(key, number))
            elapsed = time.perf_counter() - started
            kept_rows = len(resets) * group_size
            tokens_here = int(batch.lengths[:kept_rows].sum())
            generated += tokens_here
            seconds += elapsed
            if number > 0:
                steady_tokens += tokens_here
                steady_seconds += elapsed
            for prompt, (state, _) in enumerate(resets):
                for member in range(group_size):
                    row = prompt * group_size + member
                    tokens = [int(t) for t in batch.completion_ids[row, : int(batch.lengths[row])]]
                    _, _, reward, _, info = env.step(state, tokens)
                    record = rollout_record(type(env), state.key, batch.texts[row], reward, info, state.meta,
                                            policy=policy)
                    record["tokens"] = tokens
                    record["finish_reason"] = batch.finish_reasons[row]
                    if group_size > 1:
                        record["sample"] = member
                    records.append(record)
            bar.update(len(resets))
            bar.set_postfix({"reward": f"{np.mean([r['reward'] for r in records]):.3f}"}, refresh=False)
    finally:
        bar.close()
    timing = RolloutTiming(samples=len(indices), answers=len(records), generated_tokens=generated, seconds=seconds,
                           steady_tokens=steady_tokens, steady_seconds=steady_seconds)
    return records, timing
