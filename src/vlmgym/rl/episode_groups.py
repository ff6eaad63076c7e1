"""GRPO and RLOO over multi-turn episodes (vlmgym.envs.multiturn): every policy turn carries the loss, tool replies
and images are context only, and each turn's advantage is its episode's.

An episode of k turns becomes k learner rows: turn 0's row is the group's prompt and the first answer (shared by
the group like a one-turn row), turn t's row has the conversation before it as its prompt (the earlier turns' sampled
ids verbatim, the tool replies and their images) and the turn's tokens as its completion. The gradient of the
trajectory's log-probability is the sum of those rows' (a causal model scores a turn given what precedes it
alike in one long sequence or in a row of its own), so the per-token losses over all rows are the trajectory's,
and tool tokens, sitting in prompts, never carry a loss. With token_mean aggregation the loss is the mean over
every policy token of the batch; sequence_mean averages per turn.

vlmgym.rl.sampling samples the episodes (each group's `later` turns); this module lays those turns out as learner
rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from vlmgym.rl import grpo

if TYPE_CHECKING:  # vlmgym.rl.sampling samples the episodes and imports this module
    from vlmgym.rl.sampling import Group, Turn


def later_turn_chunks(groups: Sequence[Group], rows_per_micro: int) -> list[list[tuple[int, Turn]]]:
    """The later turns' rows as (group, turn) in micro-batches of at most rows_per_micro, each padded up to a power
    of two with masked copies of its last row (so a step compiles a handful of shapes)."""
    rows = [(g, turn) for g, group in enumerate(groups) for turn in group.later]
    chunks = []
    for start in range(0, len(rows), rows_per_micro):
        chunk = rows[start:start + rows_per_micro]
        size = 1 << (len(chunk) - 1).bit_length()
        last_group, last = chunk[-1]
        chunks.append(chunk + [(last_group, replace(last, mask=np.zeros_like(last.mask)))] * (size - len(chunk)))
    return chunks


def later_turn_micro_batches(policy: Any, groups: Sequence[Group], advantages: np.ndarray, group_size: int,
                             rows_per_micro: int, eos_ids: Sequence[int], mask_truncated: bool,
                             extra: Callable[[dict], dict], chunks: list | None = None
                             ) -> tuple[list[dict], np.ndarray, np.ndarray]:
    """The learner micro-batches of the later turns' rows (one observation per row, later_turn_chunks, or `chunks`
    when the caller has them already), each row with its episode's value in `advantages` [groups x group_size], and
    their sampler log-probs and loss masks in micro-batch order. `extra(micro)` adds what the trainer adds to every
    micro-batch (the reference's log-probs, the sampler's)."""
    micros, behaviour, masks = [], [], []
    for chunk in later_turn_chunks(groups, rows_per_micro) if chunks is None else chunks:
        tokens = np.stack([turn.tokens for _, turn in chunk])
        mask = np.stack([turn.mask for _, turn in chunk]).astype(np.float32)
        sampler = np.stack([turn.logprobs for _, turn in chunk]).astype(np.float32)
        loss_mask = mask * ~grpo.truncated_rows(tokens, mask, eos_ids)[:, None] if mask_truncated else mask
        batch = policy.build_batch([turn.obs for _, turn in chunk], tokens, mask)
        advantage = np.array([advantages[g * group_size + turn.member] for g, turn in chunk], np.float32)
        micro = {"batch": batch, "behaviour": sampler, "advantages": advantage, "mask": loss_mask}
        micros.append({**micro, **extra({**micro, "sampler_logprobs": sampler})})
        behaviour.append(sampler)
        masks.append(loss_mask)
    width = groups[0].mask.shape[1]
    empty = np.zeros((0, width), np.float32)
    return micros, np.concatenate(behaviour) if behaviour else empty, np.concatenate(masks) if masks else empty
