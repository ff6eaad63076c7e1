"""GRPO and RLOO over multi-turn episodes (vlmgym.envs.multiturn): every policy turn carries the loss, tool replies
and images are context only, and each turn's advantage is its episode's.

An episode of k turns becomes k learner rows: turn 0's row is the group's prompt and the first answer (shared by
the group like a one-turn row), turn t's row has the conversation before it as its prompt (the earlier turns' sampled
ids verbatim, the tool replies and their images) and the turn's tokens as its completion. The gradient of the
trajectory's log-probability is the sum of those rows' (a causal model scores a turn given what precedes it
alike in one long sequence or in a row of its own), so the per-token losses over all rows are the trajectory's,
and tool tokens, sitting in prompts, never carry a loss. With token_mean aggregation the loss is the mean over
every policy token of the batch; sequence_mean averages per turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from vlmgym.rl import grpo
from vlmgym.rollout.episodes import env_advance


def max_turns(env: Any) -> int:
    """Policy turns an env's episodes may take (1 for an env object without the multi-turn option)."""
    return int(getattr(env, "max_turns", 1))


def sample_episode_groups(policy: Any, env: Any, params: Any, indices: Sequence[int], resets: Sequence[tuple],
                          group_size: int, rng: jax.Array, first_row: int = 0) -> tuple[list[dict], int]:
    """One sampling round of multi-turn episodes: groups shaped as the one-turn trainer's (turn 0's tokens, mask
    and log-probs; `texts`, `rewards`, `infos` of each episode's final answer) with `later` (the rows of the
    episodes' later turns, each with its own observation) and `finals` (vlmgym.rollout.episodes.Final); and the
    number of policy tokens sampled."""
    states = [resets[e // group_size][0] for e in range(len(resets) * group_size)]
    advance, finals = env_advance(env, states)
    batch = policy.sample_episodes(params, [obs for _, obs in resets], group_size, rng, advance, env.max_turns,
                                   first_row)
    first = batch.turns[0]
    later: dict[int, list[dict]] = {}
    for turn, episodes, observations in zip(batch.turns[1:], batch.episodes[1:], batch.observations[1:]):
        for row, episode in enumerate(episodes):
            later.setdefault(int(episode) // group_size, []).append({
                "obs": observations[row], "member": int(episode) % group_size, "tokens": turn.completion_ids[row],
                "mask": turn.completion_mask[row], "logprobs": turn.logprobs[row]})
    groups = []
    for g, (_, obs) in enumerate(resets):
        rows = range(g * group_size, (g + 1) * group_size)
        ended = [finals[e] for e in rows]
        groups.append({"index": indices[g], "obs": obs, "tokens": first.completion_ids[rows.start:rows.stop],
                       "mask": first.completion_mask[rows.start:rows.stop],
                       "logprobs": first.logprobs[rows.start:rows.stop], "texts": [f.text for f in ended],
                       "rewards": np.array([f.reward for f in ended]), "infos": [f.info for f in ended],
                       "later": later.get(g, []), "finals": ended})
    return groups, int(sum(turn.completion_mask.sum() for turn in batch.turns))


def final_episode_rewards(env: Any, finals: Sequence[Any], rewards: np.ndarray) -> list[float]:
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


def later_turn_chunks(groups: Sequence[dict], rows_per_micro: int) -> list[list[tuple[int, dict]]]:
    """The later turns' rows as (group, row) in micro-batches of at most rows_per_micro, each padded up to a power
    of two with masked copies of its last row (so a step compiles a handful of shapes)."""
    rows = [(g, item) for g, group in enumerate(groups) for item in group.get("later", ())]
    chunks = []
    for start in range(0, len(rows), rows_per_micro):
        chunk = rows[start:start + rows_per_micro]
        size = 1 << (len(chunk) - 1).bit_length()
        chunks.append(chunk + [(chunk[-1][0], {**chunk[-1][1], "mask": np.zeros_like(chunk[-1][1]["mask"])})] * (
            size - len(chunk)))
    return chunks


def later_turn_micro_batches(policy: Any, groups: Sequence[dict], advantages: np.ndarray, group_size: int,
                             rows_per_micro: int, eos_ids: Sequence[int], mask_truncated: bool,
                             extra: Callable[[dict], dict], chunks: list | None = None
                             ) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """The learner micro-batches of the later turns' rows (one observation per row, later_turn_chunks, or `chunks`
    when the caller has them already), each row with its episode's value in `advantages` [groups x group_size], and
    their sampler log-probs and loss masks in micro-batch order. `extra(micro)` adds what the trainer adds to every
    micro-batch (the reference's log-probs, the sampler's)."""
    micros, behaviour, masks = [], [], []
    for chunk in later_turn_chunks(groups, rows_per_micro) if chunks is None else chunks:
        tokens = np.stack([item["tokens"] for _, item in chunk])
        mask = np.stack([item["mask"] for _, item in chunk]).astype(np.float32)
        sampler = np.stack([item["logprobs"] for _, item in chunk]).astype(np.float32)
        loss_mask = mask * ~grpo.truncated_rows(tokens, mask, eos_ids)[:, None] if mask_truncated else mask
        batch = policy.build_batch([item["obs"] for _, item in chunk], tokens, mask)
        advantage = np.array([advantages[g * group_size + item["member"]] for g, item in chunk], np.float32)
        micro = {"batch": batch, "behaviour": sampler, "advantages": advantage, "mask": loss_mask}
        micros.append({**micro, **extra({**micro, "sampler_logprobs": sampler})})
        behaviour.append(sampler)
        masks.append(loss_mask)
    width = groups[0]["mask"].shape[1]
    empty = np.zeros((0, width), np.float32)
    return micros, np.concatenate(behaviour) if behaviour else empty, np.concatenate(masks) if masks else empty
