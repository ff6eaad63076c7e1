"""Figures of multi-turn episodes (vlmgym.envs.multiturn) over rollout records that hold a trajectory
(`episode_turns`, `tool_calls`; vlmgym.eval.rollouts.answer_episodes), so the shared bootstrap gives them intervals
and paired differences like every other metric:

- `episode_turns`: policy turns per episode, the answer's included;
- `tool_calls_per_episode`, and `tool_call_valid_rate`: the share of calls the tool ran (the rest were refused:
  unparseable, unknown tool, out-of-range box);
- `mean_reward_turns_<k>`: the mean reward of the episodes that took k turns (the answer given at once: k = 1),
  a ratio over those episodes, so it compares how well the policy does when it looks again and when it does not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vlmgym.stats.bootstrap import Statistic


def episode_statistics(records: Sequence[Mapping[str, Any]]) -> dict[str, Statistic]:
    """The figures above over records of multi-turn episodes (records of one-turn answers: none)."""
    if not records or any("episode_turns" not in r for r in records):
        return {}
    turns = np.array([int(r["episode_turns"]) for r in records], np.float64)
    calls = [list(r.get("tool_calls") or []) for r in records]
    made = np.array([len(c) for c in calls], np.float64)
    valid = np.array([sum(bool(call.get("ok")) for call in c) for c in calls], np.float64)
    rewards = np.array([float(r["reward"]) for r in records], np.float64)
    stats = {"episode_turns": Statistic("mean", turns), "tool_calls_per_episode": Statistic("mean", made),
             "tool_call_valid_rate": Statistic("ratio", valid, made)}
    for count in sorted(set(turns.astype(int))):
        taken = (turns == count).astype(np.float64)
        stats[f"mean_reward_turns_{count}"] = Statistic("ratio", rewards * taken, taken)
    return stats
