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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from vlmgym.envs.multiturn import CONVERSATION
from vlmgym.eval.blind import blank_observation
from vlmgym.eval.records import json_safe, rollout_record
from vlmgym.rollout.episodes import env_advance, run_episodes


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
    from vlmgym.models.checkpoint import load_checkpoint
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
            if blank_images:
                resets = [blind_reset(state, obs) for state, obs in resets]
            observations = [obs for _, obs in resets]
            observations += [observations[-1]] * (batch_size - len(observations))
            started = time.perf_counter()
            if getattr(env, "max_turns", 1) > 1:
                episodes = answer_episodes(engine, params, env, resets, observations, group_size,
                                           jax.random.fold_in(key, number), policy)
                records += episodes.records
                elapsed = time.perf_counter() - started
                tokens_here = episodes.tokens
            else:
                batch = engine.generate(params, observations, group_size, jax.random.fold_in(key, number))
                elapsed = time.perf_counter() - started
                tokens_here = int(batch.lengths[:len(resets) * group_size].sum())
                records += one_turn_records(batch, env, resets, group_size, policy)
            generated += tokens_here
            seconds += elapsed
            if number > 0:
                steady_tokens += tokens_here
                steady_seconds += elapsed
            bar.update(len(resets))
            bar.set_postfix({"reward": f"{np.mean([r['reward'] for r in records]):.3f}"}, refresh=False)
    finally:
        bar.close()
    timing = RolloutTiming(samples=len(indices), answers=len(records), generated_tokens=generated, seconds=seconds,
                           steady_tokens=steady_tokens, steady_seconds=steady_seconds)
    return records, timing


def one_turn_records(batch: Any, env: Any, resets: Sequence[tuple], group_size: int, policy: str) -> list[dict]:
    """The records of a one-turn batch's real rows, scored by the env."""
    records = []
    for prompt, (state, _) in enumerate(resets):
        for member in range(group_size):
            row = prompt * group_size + member
            tokens = [int(t) for t in batch.completion_ids[row, : int(batch.lengths[row])]]
            _, _, reward, _, info = env.step(state, tokens)
            record = rollout_record(type(env), state.key, batch.texts[row], reward, info, state.meta, policy=policy)
            record["tokens"] = tokens
            record["finish_reason"] = batch.finish_reasons[row]
            if group_size > 1:
                record["sample"] = member
            records.append(record)
    return records


@dataclass(frozen=True)
class AnsweredEpisodes:
    records: list[dict]
    tokens: int  # policy tokens generated over every turn of the real episodes


def answer_episodes(engine: Any, params: Any, env: Any, resets: Sequence[tuple], observations: Sequence[dict],
                    group_size: int, key: jax.Array, policy: str) -> AnsweredEpisodes:
    """Multi-turn episodes (vlmgym.envs.multiturn) for the resets (observations padded to the batch size), as
    records of their final answers with the whole trajectory: `turns` (each turn's text), `turn_tokens`, the env's
    `tool_calls` and `episode_turns`; `tokens` and `finish_reason` are the first turn's (what transformers'
    greedy baseline answers from the same prompt)."""
    states = [resets[min(e // group_size, len(resets) - 1)][0] for e in range(len(observations) * group_size)]
    advance, finals = env_advance(env, states)
    batch = run_episodes(engine, params, observations, group_size, key, advance, env.max_turns)
    real = len(resets) * group_size
    turn_tokens: dict[int, list[list[int]]] = {}
    for turn, episodes in zip(batch.turns, batch.episodes):
        for row, episode in enumerate(episodes):
            if episode < real:
                turn_tokens.setdefault(int(episode), []).append(
                    [int(t) for t in turn.completion_ids[row, : int(turn.lengths[row])]])
    records = []
    for episode in range(real):
        state, final = resets[episode // group_size][0], finals[episode]
        record = rollout_record(type(env), state.key, final.text, final.reward, final.info, state.meta, policy=policy)
        record.update(turns=batch.texts(episode), turn_tokens=turn_tokens[episode], tokens=turn_tokens[episode][0],
                      finish_reason=batch.turns[0].finish_reasons[episode], episode_turns=len(turn_tokens[episode]),
                      tool_calls=json_safe(final.info.get("tool_calls", [])))
        if group_size > 1:
            record["sample"] = episode % group_size
        records.append(record)
    return AnsweredEpisodes(records, sum(len(t) for tokens in turn_tokens.values() for t in tokens))


def blind_reset(state: Any, observation: dict) -> tuple[Any, dict]:
    """A reset for the text-only baseline: the observation's images blanked, and in a multi-turn episode the
    conversation its tools work on too (a zoom must not see what the prompt hides)."""
    blank = blank_observation(observation)
    conversation = state.extra.get(CONVERSATION) if isinstance(getattr(state, "extra", None), dict) else None
    if conversation is None:
        return state, blank
    return replace(state, extra={**state.extra, CONVERSATION: blank}), blank
