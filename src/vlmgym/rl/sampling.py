"""An RL step, part 1: sampling. What every online algorithm trains on (GRPO/RLOO, PPO, online DPO): a batch of
prompts, group_size answers to each, scored by the env. The objective (vlmgym.rl.objective) turns a `Batch` into a
loss, the update (vlmgym.rl.update) into new params."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np

from vlmgym.envs.base import Env
from vlmgym.eval.metrics import answer_spread
from vlmgym.params import TrainParams
from vlmgym.rl import grpo
from vlmgym.rl.loop import DataOrder, Policy, score
from vlmgym.rl.multiprocess import any_process
from vlmgym.rl.prefetch import ResetPrefetcher
from vlmgym.rl.trainer_parts import final_rewards, part_figures
from vlmgym.rollout.episodes import env_advance, final_episode_rewards, max_turns
from vlmgym.runtime import distributed


@dataclass(frozen=True)
class Turn:
    """A later turn of a multi-turn episode: a learner row of its own, the conversation before it as its prompt."""

    obs: dict
    member: int  # the episode's answer within its group
    tokens: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray


@dataclass(frozen=True)
class Group:
    """One prompt's group_size answers, scored ([group_size, max_new_tokens] per-token arrays; on an env with tools,
    the episodes' first turns, their final answers' texts, rewards and infos)."""

    index: int  # the prompt's dataset index
    obs: dict | None  # None: sampled by another process (its images are not here)
    tokens: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray  # the sampler's
    texts: list[str]
    rewards: np.ndarray
    infos: list[dict]
    later: tuple[Turn, ...] = ()  # the episodes' later turns (none for one-turn answers)
    finals: tuple | None = None  # the episodes' ends (vlmgym.rollout.episodes.Final); None for one-turn answers
    padding: bool = False  # a dropped group that only pads the batch's shape: every mask 0

    def as_padding(self) -> Group:
        """This group masked out whole, to pad a batch whose sampling rounds ran out."""
        return replace(self, mask=np.zeros_like(self.mask), padding=True,
                       later=tuple(replace(turn, mask=np.zeros_like(turn.mask)) for turn in self.later))


@dataclass
class Sampled:
    """Everything a step sampled, kept or not: what its reward figures describe."""

    groups: int = 0
    zero_std_groups: int = 0
    tokens: int = 0
    rollout_time: float = 0.0
    rewards: Any = field(default_factory=list)  # lists while sampling, float64 arrays in a Batch
    final_rewards: Any = field(default_factory=list)
    overlong_penalty: Any = field(default_factory=list)
    infos: list = field(default_factory=list)
    texts: list = field(default_factory=list)

    def as_arrays(self) -> Sampled:
        return replace(self, **{name: np.asarray(getattr(self, name), np.float64)
                                for name in ("rewards", "final_rewards", "overlong_penalty")})


@dataclass(frozen=True)
class Batch:
    """A step's groups (group-contiguous rows: group g is rows [g * group_size, (g + 1) * group_size)) and what
    sampling them took."""

    groups: list[Group]
    sampled: Sampled
    rounds: int  # sampling rounds
    groups_filtered: int  # groups dropped for rewards without spread (train.filter_groups)
    num_padding: int

    @property
    def rewards(self) -> np.ndarray:
        return np.concatenate([g.rewards for g in self.groups]).astype(np.float32)

    @property
    def mask(self) -> np.ndarray:
        return np.concatenate([g.mask for g in self.groups]).astype(np.float32)

    @property
    def tokens(self) -> np.ndarray:
        return np.concatenate([g.tokens for g in self.groups])

    @property
    def sampler_logprobs(self) -> np.ndarray:
        return np.concatenate([g.logprobs for g in self.groups]).astype(np.float32)

    def real_rows(self, group_size: int) -> np.ndarray:
        """[rows] bool: the rows of groups that are not padding."""
        return np.repeat([not g.padding for g in self.groups], group_size)


class Sampler:
    """Each step's batch: the next prompts in a resumable seeded order (`data`), group_size answers each, scored,
    with train.filter_groups' extra rounds and train.objective.overlong_buffer's penalty."""

    def __init__(self, policy: Policy, env: Env, config: TrainParams):
        if max_turns(env) > 1 and (config.objective.overlong_buffer or distributed.count() > 1):
            raise ValueError(f"train: env {env.name!r} runs episodes of up to {env.max_turns} turns, which "
                             "train.objective.overlong_buffer and training over several processes do not support yet")
        self.policy, self.env, self.config = policy, env, config
        self.data = DataOrder(len(env), config.seed)
        self.prefetch = ResetPrefetcher(env, getattr(policy, "prepare_ahead", None))

    def batch(self, params: Any, progress: float, rng: jax.Array) -> Batch:
        """Sample and score groups until the batch is full (dropping the groups whose filter_metric does not vary
        when filtering). Each process fills its own share of the step's prompts (all of them in a single-process
        run), and every process samples as many rounds as the one that needs the most (the rounds' data and the
        sampling copy of the params are shared), so the data order stays the same everywhere."""
        c = self.config
        # The curriculum follows training progress, not env resets (which sampling rounds would skew).
        self.env.set_progress(progress)
        first, stop = distributed.local_range(c.batch_prompts)
        sampled = Sampled()
        kept, spare, rounds = [], [], 0
        while True:
            for group in self._round(params, jax.random.fold_in(rng, rounds), first, stop, sampled):
                if c.filter_groups and grpo.filter_groups(filter_values(c.filter_metric, group),
                                                          c.group_size).num_dropped == 1:
                    spare.append(group)
                elif len(kept) < stop - first:
                    kept.append(group)
            rounds += 1
            if not c.filter_groups or rounds >= c.max_sample_rounds or not any_process(len(kept) < stop - first):
                break
        # Sampling rounds ran out: fill the share with the dropped groups, masked out so they only pad the shape.
        padding = [group.as_padding() for group in spare[: stop - first - len(kept)]]
        batch = Batch(kept + padding, sampled, rounds, len(spare), len(padding))
        return gathered(batch) if distributed.count() > 1 else replace(batch, sampled=sampled.as_arrays())

    def _round(self, params: Any, rng: jax.Array, first: int, stop: int, sampled: Sampled) -> list[Group]:
        """One round: this process's prompts of the next batch, group_size answers each, scored; counted in
        `sampled` (everything sampled, whether kept or not)."""
        c = self.config
        indices = self.data.take(c.batch_prompts)[first:stop]
        resets = self.prefetch.resets(indices)
        self.prefetch.ahead(self.data.peek(c.batch_prompts)[first:stop])
        started = time.perf_counter()
        if max_turns(self.env) > 1:
            groups, tokens = episode_groups(self.policy, self.env, params, indices, resets, c.group_size, rng,
                                            first * c.group_size)
        else:
            groups, tokens = self._answers(params, indices, resets, rng, first)
        sampled.rollout_time += time.perf_counter() - started
        sampled.tokens += tokens
        if c.objective.overlong_buffer:
            penalties = [overlong_penalties(c, group.mask) for group in groups]
            groups = [replace(group, rewards=group.rewards + penalty) for group, penalty in zip(groups, penalties)]
            for penalty in penalties:
                sampled.overlong_penalty.extend(penalty)
        for group, (state, _) in zip(groups, resets):
            sampled.groups += 1
            sampled.rewards.extend(group.rewards)
            sampled.final_rewards.extend(
                final_episode_rewards(self.env, group.finals, group.rewards) if group.finals is not None
                else final_rewards(self.env, state, group.tokens, group.mask, group.rewards))
            sampled.infos.extend(group.infos)
            sampled.texts.extend(group.texts)
            sampled.zero_std_groups += grpo.filter_groups(group.rewards, c.group_size).num_dropped == 1
        return groups

    def _answers(self, params: Any, indices: list[int], resets: list[tuple], rng: jax.Array,
                 first: int) -> tuple[list[Group], int]:
        """One-turn groups: group_size answers per reset, scored; and the tokens sampled."""
        c = self.config
        where = {"first_row": first * c.group_size} if first else {}
        samples = self.policy.sample(params, [obs for _, obs in resets], c.group_size, rng, **where)
        groups = []
        for g, (state, obs) in enumerate(resets):
            rows = slice(g * c.group_size, (g + 1) * c.group_size)
            scored = [score(self.env, state, samples.tokens[r], samples.mask[r])
                      for r in range(rows.start, rows.stop)]
            groups.append(Group(index=indices[g], obs=obs, tokens=samples.tokens[rows], mask=samples.mask[rows],
                                logprobs=samples.logprobs[rows], texts=samples.texts[rows],
                                rewards=np.array([s[0] for s in scored]), infos=[s[1] for s in scored]))
        return groups, int(samples.mask.sum())

    def close(self) -> None:
        self.prefetch.close()


def episode_groups(policy: Any, env: Env, params: Any, indices: list[int], resets: list[tuple], group_size: int,
                   rng: jax.Array, first_row: int = 0) -> tuple[list[Group], int]:
    """One sampling round of multi-turn episodes (vlmgym.rl.episode_groups): groups of the episodes' first turns,
    their final answers' texts, rewards and infos, their later turns and their ends; and the policy tokens
    sampled."""
    states = [resets[e // group_size][0] for e in range(len(resets) * group_size)]
    advance, finals = env_advance(env, states)
    batch = policy.sample_episodes(params, [obs for _, obs in resets], group_size, rng, advance, env.max_turns,
                                   first_row)
    first = batch.turns[0]
    later: dict[int, list[Turn]] = {}
    for turn, episodes, observations in zip(batch.turns[1:], batch.episodes[1:], batch.observations[1:]):
        for row, episode in enumerate(episodes):
            later.setdefault(int(episode) // group_size, []).append(Turn(
                obs=observations[row], member=int(episode) % group_size, tokens=turn.completion_ids[row],
                mask=turn.completion_mask[row], logprobs=turn.logprobs[row]))
    groups = []
    for g, (_, obs) in enumerate(resets):
        rows = slice(g * group_size, (g + 1) * group_size)
        ended = tuple(finals[e] for e in range(rows.start, rows.stop))
        groups.append(Group(index=indices[g], obs=obs, tokens=first.completion_ids[rows],
                            mask=first.completion_mask[rows], logprobs=first.logprobs[rows],
                            texts=[f.text for f in ended], rewards=np.array([f.reward for f in ended]),
                            infos=[f.info for f in ended], later=tuple(later.get(g, ())), finals=ended))
    return groups, int(sum(turn.completion_mask.sum() for turn in batch.turns))


def gathered(local: Batch) -> Batch:
    """Every process's batch merged, as one process sampling the whole step would return it: the groups in process
    order (the order of the step's prompts; a group another process sampled has no observation, obs None), counts
    summed, everything sampled concatenated."""
    groups, mine = local.groups, local.sampled
    described = [{"index": g.index, "texts": list(g.texts), "infos": g.infos, "padding": g.padding} for g in groups]
    arrays = {name: distributed.gather_rows(np.stack([getattr(g, name) for g in groups]))
              for name in ("tokens", "mask", "logprobs", "rewards")}
    rewards = {name: distributed.gather_rows(np.asarray(getattr(mine, name), np.float64))
               for name in ("rewards", "final_rewards")}
    # Only with train.objective.overlong_buffer on (the same on every process): no collective for an empty list.
    penalty = (distributed.gather_rows(np.asarray(mine.overlong_penalty, np.float64)) if mine.overlong_penalty
               else np.zeros(0))
    counts = {"groups": mine.groups, "zero_std_groups": mine.zero_std_groups, "tokens": mine.tokens,
              "num_padding": local.num_padding, "groups_filtered": local.groups_filtered}
    figures = distributed.gather_json({"described": described, "rollout_time": mine.rollout_time,
                                       "infos": mine.infos, "texts": mine.texts, **counts})
    observations = [None] * sum(len(f["described"]) for f in figures)
    first = sum(len(f["described"]) for f in figures[:distributed.index()])
    observations[first: first + len(groups)] = [g.obs for g in groups]
    described = [g for f in figures for g in f["described"]]
    merged = [Group(**described[i], obs=observations[i], **{name: arrays[name][i] for name in arrays})
              for i in range(len(described))]
    total = {name: sum(f[name] for f in figures) for name in counts}
    sampled = Sampled(groups=total["groups"], zero_std_groups=total["zero_std_groups"], tokens=total["tokens"],
                      rollout_time=max(f["rollout_time"] for f in figures), **rewards, overlong_penalty=penalty,
                      infos=[i for f in figures for i in f["infos"]], texts=[t for f in figures for t in f["texts"]])
    return Batch(merged, sampled, local.rounds, total["groups_filtered"], total["num_padding"])


def overlong_penalties(config: TrainParams, mask: np.ndarray) -> np.ndarray:
    """Each answer's soft overlong penalty (train.objective.overlong_buffer), by its length in tokens."""
    objective = config.objective
    return grpo.soft_overlong_penalty(np.asarray(mask).sum(axis=1), config.max_new_tokens, objective.overlong_buffer,
                                      objective.overlong_penalty)


def filter_values(metric: str, group: Group) -> np.ndarray:
    """What filter_groups checks for spread in a group: its rewards, or one reward component of each answer."""
    if metric == "reward":
        return group.rewards
    values = []
    for info in group.infos:
        components = info.get("reward_components") or {}
        if metric not in components:
            raise ValueError(f"train.filter_metric={metric!r}: the env's answers carry no such reward component "
                             f"(they report: {', '.join(sorted(components)) or 'none'}; or use reward)")
        values.append(float(components[metric]))
    return np.asarray(values)


def sampled_figures(batch: Batch, eos_ids: tuple[int, ...], overlong: bool) -> dict[str, float]:
    """The step's figures of what it sampled: rewards over everything sampled, dropped groups included (what the
    policy scores now), and the kept answers' lengths."""
    sampled = batch.sampled
    rewards = sampled.rewards
    out = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
           # the same samples at the curriculum's final weights: the headline training curve
           "final_reward_mean": float(sampled.final_rewards.mean()),
           "zero_std_group_share": sampled.zero_std_groups / sampled.groups,
           "groups_dropped": float(batch.groups_filtered),
           "sample_rounds": float(batch.rounds),
           # the evaluate stage's collapse check on the step's samples: near 1, every group answers alike
           "answer_top_share": answer_spread(sampled.texts)["top_share"]}
    components: dict[str, list[float]] = {}
    for info in sampled.infos:
        for name, value in (info.get("reward_components") or {}).items():
            components.setdefault(name, []).append(float(value))
    out.update({f"reward/{name}": float(np.mean(values)) for name, values in sorted(components.items())})
    out.update(part_figures(sampled.infos, rewards, sampled.final_rewards))
    out.update(tool_figures(sampled.infos))
    if overlong:
        out["overlong_penalty"] = float(sampled.overlong_penalty.mean())
    mask, tokens = batch.mask, batch.tokens
    active_rows = mask.sum(axis=1) > 0
    lengths = mask.sum(axis=1)[active_rows]
    out["completion_length"] = float(lengths.mean()) if lengths.size else 0.0
    ended = ~grpo.truncated_rows(tokens, mask, eos_ids)
    out["truncated_share"] = float(1.0 - ended[active_rows].mean()) if lengths.size else 0.0
    return out


def tool_figures(infos: list[dict]) -> dict[str, float]:
    """Multi-turn episodes' tool use (none for one-turn answers): turns per episode, tool calls per episode, and
    the share of calls the tool refused."""
    if not infos or "turns" not in infos[0]:
        return {}
    calls = [call for info in infos for call in info.get("tool_calls", ())]
    return {"episode_turns": float(np.mean([info["turns"] for info in infos])),
            "tool_calls_per_episode": len(calls) / len(infos),
            "tool_call_error_share": sum(not call["ok"] for call in calls) / max(len(calls), 1)}


def sample_rows(groups: list[Group], group_size: int, count: int) -> list[dict]:
    """The samples table's rows: round-robin over groups, so it shows many prompts before a second answer to any of
    them (padding groups and groups sampled by another process left out)."""
    shown = [g for g in groups if not g.padding and g.obs is not None]
    rows = []
    for member in range(group_size):
        for group in shown:
            if len(rows) == count:
                return rows
            info = group.infos[member]
            rows.append({"index": group.index, "images": group.obs.get("images", []),
                         "answer": group.texts[member], "reward": float(group.rewards[member]),
                         "reward_components": dict(info.get("reward_components") or {})})
    return rows
