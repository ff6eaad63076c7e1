"""Validation during training: every `val_every` steps the policy answers a held-out split (greedy, and sampled
at the training temperature), scored at curriculum progress 1; the best point by greedy reward is kept on disk,
so a run can end on it (`select: best_val`) or stop early when validation stops improving.

The validation split is the shard stage's `val` split: carved out of train (`shard.val_samples`), so it is held out
from training and distinct from test. The figures go to MLflow beside the step's training figures as `val/...`;
step 0 (the start policy) is validated too, so `best_val` can also select "no update helped".
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from vlmgym.envs.base import PART_KEY, Env, part_metric
from vlmgym.rl.checkpoint import _abstract
from vlmgym.rl.loop import score
from vlmgym.rollout.episodes import env_advance, max_turns
from vlmgym.runtime import distributed, temps

SELECT_CHOICES = ("last", "best_val")
SELECTION_METRIC = "val/reward_greedy"
BEST_DIR = "best"


@dataclass(frozen=True)
class ValidationSettings:
    """How often and on what a training loop validates, and what it does with the result."""

    every: int  # validate every this many steps (0: never)
    batch_size: int  # prompts per sampling call (the last batch is padded to it: one compile)
    select: str = "last"  # last | best_val: which params the run ends with
    early_stop_patience: int = 0  # stop after this many validations without a new best (0: never)
    sampled: bool = True  # also one sampled answer per prompt (at the policy's sampling settings)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.select not in SELECT_CHOICES:
            raise ValueError(f"select must be one of {SELECT_CHOICES}, got {self.select!r}")
        if self.every < 0 or self.batch_size < 1 or self.early_stop_patience < 0:
            raise ValueError(f"validation: every={self.every} and early_stop_patience={self.early_stop_patience} "
                             f"must be >= 0 and batch_size={self.batch_size} >= 1")
        if self.every == 0 and (self.select != "last" or self.early_stop_patience):
            raise ValueError(f"select={self.select!r} / early_stop_patience={self.early_stop_patience} need "
                             "validation: set val_every > 0")


def answer_rewards(env: Env, samples: Any, states: Sequence[Any],
                   parts: list | None = None) -> tuple[list[float], list[bool]]:
    """Rewards and format flags of one answer per state (samples rows in state order); appends each answer's
    sub-env (info[PART_KEY], None for an env not made of several) to `parts` when given."""
    scored = [score(env, state, tokens, mask) for state, tokens, mask in zip(states, samples.tokens, samples.mask)]
    if parts is not None:
        parts.extend(info.get(PART_KEY) for _, info in scored)
    return [reward for reward, _ in scored], [bool(info.get("format_ok", True)) for _, info in scored]


def episode_rewards(env: Env, play: Callable[[Any, int], Any], states: Sequence[Any], size: int,
                    parts: list | None = None) -> tuple[list[float], list[bool]]:
    """`answer_rewards` of multi-turn episodes: `play(advance, max_turns)` runs one episode per observation (the
    batch padded to `size` with copies of the last), each scored by its final turn."""
    advance, finals = env_advance(env, [*states, *[states[-1]] * (size - len(states))])
    play(advance, env.max_turns)
    ended = [finals[episode] for episode in range(len(states))]
    if parts is not None:
        parts.extend(final.info.get(PART_KEY) for final in ended)
    return [final.reward for final in ended], [bool(final.info.get("format_ok", True)) for final in ended]


def part_means(name: str, values: Sequence[float], parts: Sequence[Any]) -> dict[str, float]:
    """The mean of `values` over each sub-env's answers, as env/<part>/<name> (none when no answer names one)."""
    groups: dict[str, list[float]] = {}
    for value, part in zip(values, parts):
        if part is not None:
            groups.setdefault(str(part), []).append(float(value))
    return {part_metric(part, name): float(np.mean(v)) for part, v in sorted(groups.items())}


class Validator:
    """Scores a policy on the validation env and tracks the best point; its state is saved with checkpoints.

    `extra` adds figures of the loop's own (SFT: the teacher-forced loss on the split's ideal answers).
    """

    def __init__(self, policy: Any, env: Env, settings: ValidationSettings, best_dir: str | Path, *,
                 extra: Callable[[Any], dict[str, float]] | None = None):
        if len(env) == 0:
            raise ValueError("validation env has no samples")
        self.policy, self.env, self.settings, self.extra = policy, env, settings, extra
        self.best_dir = Path(best_dir)
        self.best_score: float | None = None
        self.best_step: int | None = None
        self.since_best = 0  # validations since the best one
        self.stopped_at: int | None = None

    def due(self, done: int, total: int) -> bool:
        """Whether to validate after `done` steps: every `every` steps and after the last one."""
        every = self.settings.every
        return every > 0 and (done % every == 0 or done == total)

    def evaluate(self, params: Any) -> dict[str, float]:
        """val/ figures of `params`: greedy (and sampled) mean reward and format rate at progress 1."""
        progress = self.env.progress
        self.env.set_progress(1.0)  # a fixed yardstick while the training curriculum moves
        try:
            indices = list(range(len(self.env)))
            size = self.settings.batch_size
            greedy, sampled, formats, parts = [], [], [], []
            key = jax.random.key(self.settings.seed)
            for number, start in enumerate(range(0, len(indices), size)):
                resets = [self.env.reset(i) for i in indices[start: start + size]]
                states = [s for s, _ in resets]
                observations = [o for _, o in resets]
                observations += [observations[-1]] * (size - len(observations))  # one shape: one compile
                sample_key = jax.random.fold_in(key, number)
                if max_turns(self.env) > 1:
                    rewards, ok = episode_rewards(self.env, partial(self.policy.greedy_episodes, params, observations),
                                                  states, size, parts)
                else:
                    rewards, ok = answer_rewards(self.env, self.policy.greedy(params, observations), states, parts)
                greedy += rewards
                formats += ok
                if self.settings.sampled and max_turns(self.env) > 1:
                    play = partial(self.policy.sample_episodes, params, observations, 1, sample_key)
                    sampled += episode_rewards(self.env, play, states, size)[0]
                elif self.settings.sampled:
                    samples = self.policy.sample(params, observations, 1, sample_key)
                    sampled += answer_rewards(self.env, samples, states)[0]
        finally:
            self.env.set_progress(progress)
        out = {"val/reward_greedy": float(np.mean(greedy)), "val/format_ok_rate": float(np.mean(formats))}
        if sampled:
            out["val/reward_sampled"] = float(np.mean(sampled))
        out.update(part_means("val/reward_greedy", greedy, parts))  # an env made of several: each one's
        if sampled:
            out.update(part_means("val/reward_sampled", sampled, parts))
        if self.extra is not None:
            out.update(self.extra(params))
        return out

    def validate(self, params: Any, done: int) -> dict[str, float]:
        """Evaluate after `done` steps, keep `params` on disk if they are the best so far; returns the figures."""
        figures = self.evaluate(params)
        score = figures[SELECTION_METRIC]
        if self.best_score is None or score > self.best_score:
            self.best_score, self.best_step, self.since_best = score, done, 0
            if self.settings.select == "best_val":
                self._save_best(params, done)
        else:
            self.since_best += 1
        patience = self.settings.early_stop_patience
        if patience and self.since_best >= patience:
            self.stopped_at = done
        figures["val/best_reward_greedy"] = float(self.best_score)
        figures["val/best_step"] = float(self.best_step)
        return figures

    def _save_best(self, params: Any, step: int) -> None:
        def write(tmp: Path) -> None:
            with ocp.StandardCheckpointer() as checkpointer:
                checkpointer.save((tmp / "params").absolute(), params)
                checkpointer.wait_until_finished()
            if distributed.is_primary():
                (tmp / "step.json").write_text(json.dumps({"step": step, "score": self.best_score}) + "\n")

        if distributed.count() > 1:  # every process validated alike; they save the global params together
            with distributed.shared_dir(self.best_dir) as tmp:
                write(tmp)
            return
        # Written beside and renamed over the old one: a kill mid-save leaves the previous best intact.
        tmp = self.best_dir.with_name(f".{self.best_dir.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        old = self.best_dir.with_name(f".{self.best_dir.name}.old")
        if self.best_dir.exists():
            os.replace(self.best_dir, old)
        os.replace(tmp, self.best_dir)
        shutil.rmtree(old, ignore_errors=True)

    def selected(self, params: Any, done: int) -> tuple[Any, int]:
        """The params the run ends with, and their step: the last ones, or the best validated ones."""
        if self.settings.select == "last" or self.best_step is None or self.best_step == done:
            return params, done
        saved = json.loads((self.best_dir / "step.json").read_text())
        if saved["step"] != self.best_step:
            raise RuntimeError(f"{self.best_dir} holds step {saved['step']}, the run's best is step {self.best_step}")
        with ocp.StandardCheckpointer() as checkpointer:
            best = checkpointer.restore((self.best_dir / "params").absolute(), _abstract(params))
        print(f"vlmgym: ending on step {self.best_step} ({SELECTION_METRIC} {self.best_score:.4f}), the best "
              f"validation ({temps.human_size(temps.disk_size(self.best_dir))} at {self.best_dir})", flush=True)
        return best, self.best_step

    def state(self) -> dict:
        """JSON-safe selection state (saved with each checkpoint)."""
        return {"best_score": self.best_score, "best_step": self.best_step, "since_best": self.since_best,
                "stopped_at": self.stopped_at}

    def load_state(self, state: dict) -> None:
        """Restore what state() saved."""
        self.best_score, self.best_step = state["best_score"], state["best_step"]
        self.since_best, self.stopped_at = int(state["since_best"]), state["stopped_at"]
