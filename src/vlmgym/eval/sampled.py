"""Sampled answers beside the greedy one: a policy's k sampled answers per prompt (`rollout.sampled_answers`,
<policy>.sampled.jsonl), summarised on each greedy record so the shared bootstrap gives them intervals and paired
differences like every other metric.

Per prompt: the mean reward of its k samples (`sampled_mean_reward`), the best of them (`best_of_k_reward`: what a
policy that picked its best sample would score; greedy rising toward it is RL turning sampled headroom into
greedy answers), and, where the env has a correctness bit
(Env.solved), whether any of the k is correct (`pass_at_k`). Greedy reward rising while pass@k stays is RL
sharpening what the policy already samples; pass@k rising is RL finding answers it did not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from vlmgym.stats.bootstrap import Statistic

if TYPE_CHECKING:  # for annotations only: importing this module does not load the envs
    from vlmgym.envs.base import Env

KEY = "sampled"  # the greedy record's field holding its prompt's sampled summary


def attach_sampled(env: type[Env], records: Sequence[Mapping[str, Any]],
                   sampled: Sequence[Mapping[str, Any]], where: str = "sampled answers") -> list[dict[str, Any]]:
    """The greedy `records`, each with {"k", "mean_reward", "best_reward", "solved"} of its prompt's sampled answers
    (solved: any of them correct, None where the env has no correctness bit); every prompt must have the same
    k > 0."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for record in sampled:
        groups.setdefault(str(record.get("id")), []).append(record)
    sizes = {len(g) for g in groups.values()}
    missing = [r["id"] for r in records if str(r["id"]) not in groups]
    if missing or len(sizes) != 1:
        raise ValueError(f"{where}: expected the same number of sampled answers for every greedy record; "
                         f"{len(missing)} prompts have none, group sizes {sorted(sizes)}")
    out = []
    for record in records:
        group = groups[str(record["id"])]
        flags = [env.solved(r) for r in group]
        solved = None if any(f is None for f in flags) else bool(any(flags))
        rewards = [float(r["reward"]) for r in group]
        summary = {"k": len(group), "mean_reward": float(np.mean(rewards)), "best_reward": max(rewards),
                   "solved": solved}
        out.append({**record, KEY: summary})
    return out


def sampled_statistics(records: Sequence[Mapping[str, Any]]) -> dict[str, Statistic]:
    """`sampled_mean_reward`, `best_of_k_reward` and `pass_at_k` over records that carry a sampled summary (none: no
    figures)."""
    summaries = [r.get(KEY) for r in records]
    if not summaries or any(s is None for s in summaries):
        return {}
    stats = {"sampled_mean_reward": Statistic("mean", np.array([s["mean_reward"] for s in summaries], np.float64))}
    stats["best_of_k_reward"] = Statistic("mean", np.array([s["best_reward"] for s in summaries], np.float64))
    if all(s["solved"] is not None for s in summaries):
        stats["pass_at_k"] = Statistic("mean", np.array([s["solved"] for s in summaries], np.float64))
    return stats
