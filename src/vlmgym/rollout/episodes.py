"""Episodes of several turns, sampled in batch: the policy answers, the env may answer back (a tool's result with a
new image), and the episodes that go on are prefilled again with their whole conversation and decode their next turn.

    batch = run_episodes(engine, params, observations, group_size, key, advance, max_turns=3)
    batch.turns[t]      # a RolloutBatch: one row per episode that took turn t (its prompt: the conversation so far)
    batch.episodes[t]   # the episode of each of those rows (episode e answers observation e // group_size)

`advance(episode, text, token_ids, finish_reason)` is called for every row of every turn with what it sampled (ids up
to and including the first EOS) and returns the next observation, the whole conversation so far with the assistant
turn carrying its sampled ids (processor.TOKEN_IDS) and the env's reply, or None when the episode is over; only a
turn that `vlmgym.models.qwen3_vl.chat.continues_conversation` may go on.

Each turn after the first re-prefills its episodes from scratch instead of extending their KV caches: a turn's
prompt is then exactly the learner's prompt for that turn's tokens (the same padded inputs, the same computation), so
the log-probs kept per turn are what the learner recomputes; the cost is one prompt forward per episode and turn.
Episodes that ended wait: a turn's batch holds only the rows still going, bucketed like any batch of prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from vlmgym.models.qwen3_vl.chat import continues_conversation
from vlmgym.rollout.engine import RolloutBatch, RolloutEngine

if TYPE_CHECKING:  # for annotations only: importing this module does not load the envs
    from vlmgym.envs.base import Env

# (episode, text, token ids sampled this turn, finish reason "eos" or "length") -> next observation or None
Advance = Callable[[int, str, list[int], str], "dict[str, Any] | None"]


@dataclass
class EpisodeBatch:
    """The turns of `num_episodes` episodes, group_size per observation of the first turn."""

    group_size: int
    num_episodes: int
    turns: list[RolloutBatch]  # turn 0 holds every episode, group-shared prompts; later turns one row per episode
    episodes: list[np.ndarray]  # turn t: the episode of each row of turns[t]
    observations: list[list[dict]]  # turn t: the observation each prompt row of turns[t] is (turn 0: per group)

    @property
    def turn_counts(self) -> np.ndarray:
        """How many turns each episode took."""
        counts = np.zeros(self.num_episodes, np.int32)
        for rows in self.episodes:
            counts[rows] += 1
        return counts

    def texts(self, episode: int) -> list[str]:
        """What the policy wrote in each of the episode's turns."""
        return [turn.texts[int(np.flatnonzero(rows == episode)[0])]
                for turn, rows in zip(self.turns, self.episodes) if episode in rows]


def run_episodes(engine: RolloutEngine, params: Any, observations: Sequence[dict], group_size: int, key: jax.Array,
                 advance: Advance, max_turns: int, first_row: int = 0) -> EpisodeBatch:
    """Sample group_size episodes per observation, up to max_turns policy turns each (see the module doc).

    Turn 0 draws as `engine.generate(params, observations, group_size, key, first_row)` does; turn t > 0 draws with
    `fold_in(key, t)` and numbers its rows in episode order among the episodes still going."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    first = engine.generate(params, observations, group_size, key, first_row)
    batch = EpisodeBatch(group_size, len(observations) * group_size, [first],
                         [np.arange(len(observations) * group_size)], [list(observations)])
    for turn in range(1, max_turns + 1):
        going, replies = _advance_all(engine, batch.turns[-1], batch.episodes[-1], advance)
        if not going:
            break
        if turn == max_turns:
            raise RuntimeError(f"episodes {going[:8]} went on after max_turns={max_turns} turns: the env's step must "
                               "end an episode at its last turn")
        step = engine.generate(params, replies, 1, jax.random.fold_in(key, turn), first_row)
        batch.turns.append(step)
        batch.episodes.append(np.asarray(going))
        batch.observations.append(replies)
    return batch


def _advance_all(engine: RolloutEngine, turn: RolloutBatch, episodes: np.ndarray,
                 advance: Advance) -> tuple[list[int], list[dict]]:
    """The episodes that go on after `turn` and their next observations."""
    going, replies = [], []
    for row, episode in enumerate(episodes):
        ids = turn.completion_ids[row, :int(turn.lengths[row])].tolist()
        reply = advance(int(episode), turn.texts[row], ids, turn.finish_reasons[row])
        if reply is None:
            continue
        if not continues_conversation(engine.processor.tokenizer, ids):
            raise RuntimeError(f"episode {episode} went on after a turn that cannot continue a conversation "
                               f"({turn.finish_reasons[row]}, {len(ids)} tokens): the env must end it "
                               "(chat.continues_conversation)")
        going.append(int(episode))
        replies.append(reply)
    return going, replies


@dataclass(frozen=True)
class Final:
    """How an episode ended: the env's reward and info for its last turn, that turn's text, and the state it
    was scored in (to score the same answer again, e.g. at another curriculum progress)."""

    reward: float
    info: dict
    text: str
    state: Any


def env_advance(env: Env, states: list[Any]) -> tuple[Advance, dict[int, Final]]:
    """An `advance` that steps `env` (episode e starts from states[e], updated in place) and the dict it fills with
    each finished episode's Final."""
    finals: dict[int, Final] = {}

    def advance(episode: int, text: str, token_ids: list[int], finish_reason: str) -> dict | None:
        before = states[episode]
        state, reply, reward, done, info = env.step(before, token_ids)
        states[episode] = state
        if done:
            finals[episode] = Final(float(reward), info, text, before)
            return None
        return reply

    return advance, finals


def max_turns(env: Env) -> int:
    """Policy turns an env's episodes may take (1 for an env object without the multi-turn option)."""
    return int(getattr(env, "max_turns", 1))


def final_episode_rewards(env: Env, finals: Sequence[Any], rewards: np.ndarray) -> list[float]:
    """Each episode's final answer scored at training progress 1 (vlmgym.rl.trainer_parts.final_rewards' yardstick
    for episodes): `rewards` reused once progress is 1."""
    progress = env.progress
    if progress >= 1.0:
        return [float(r) for r in rewards]
    env.set_progress(1.0)
    try:
        return [float(env.score_answer(final.state, final.text)[2]) for final in finals]
    finally:
        env.set_progress(progress)
