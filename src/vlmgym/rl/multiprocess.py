"""The GRPO trainer over several processes (vlmgym.runtime.distributed): what it supports, and each step's sampled
groups gathered from every process."""

from __future__ import annotations

from typing import Any

import numpy as np

from vlmgym.rl import grpo
from vlmgym.runtime import distributed

MULTIPROCESS_ALGORITHMS = ("grpo", "rloo")


def check_multiprocess(config: Any, policy: Any) -> None:
    """What a run over several processes supports (JAX's multi-controller runtime: vlmgym.runtime.distributed)."""
    processes = distributed.count()
    if config.algorithm not in MULTIPROCESS_ALGORITHMS:
        raise ValueError(f"train.algorithm={config.algorithm!r} runs in one process; over {processes} processes "
                         f"train supports {', '.join(MULTIPROCESS_ALGORITHMS)}")
    if config.filter_groups:
        raise ValueError(f"train.filter_groups resamples until each process's batch is full, which would make the "
                         f"processes take different numbers of prompts; turn it off over {processes} processes")
    if config.batch_prompts % processes:
        raise ValueError(f"train.batch_prompts={config.batch_prompts} must split evenly over {processes} processes "
                         "(each samples its own prompts' groups)")
    if getattr(policy, "mesh", None) is None:
        raise ValueError(f"a run over {processes} processes needs a device mesh over all of them (train.mesh)")


def gathered_collection(groups: list[dict], rollout_time: float, sampled_tokens: int, final: list[float],
                        overlong: list[float]) -> dict:
    """Every process's sampled groups (in process order, the order of the step's prompts) on every process, as
    `_collect` returns them; a group another process sampled has no observation (obs None)."""
    local = [{"index": g["index"], "texts": list(g["texts"]), "infos": g["infos"]} for g in groups]
    arrays = {name: distributed.gather_rows(np.stack([g[name] for g in groups]))
              for name in ("tokens", "mask", "logprobs", "rewards")}
    final = distributed.gather_rows(np.asarray(final, np.float64))
    overlong = distributed.gather_rows(np.asarray(overlong, np.float64))
    figures = distributed.gather_json({"groups": local, "rollout_time": rollout_time,
                                       "sampled_tokens": sampled_tokens})
    observations = [None] * sum(len(f["groups"]) for f in figures)
    first = sum(len(f["groups"]) for f in figures[:distributed.index()])
    observations[first: first + len(groups)] = [g["obs"] for g in groups]
    described = [g for f in figures for g in f["groups"]]
    merged = [{**described[i], "obs": observations[i], **{name: arrays[name][i] for name in arrays}}
              for i in range(len(described))]
    zero_std = sum(grpo.filter_groups(g["rewards"], len(g["rewards"])).num_dropped == 1 for g in merged)
    return {"groups": merged, "num_padding": 0, "sampled_groups": len(merged), "zero_std_groups": int(zero_std),
            "rounds": 1, "rollout_time": max(f["rollout_time"] for f in figures),
            "sampled_tokens": sum(f["sampled_tokens"] for f in figures),
            "sampled_rewards": np.concatenate([g["rewards"] for g in merged]).astype(np.float64),
            "final_rewards": final, "groups_filtered": 0, "overlong_penalty": overlong,
            "sampled_infos": [i for g in merged for i in g["infos"]],
            "sampled_texts": [t for g in merged for t in g["texts"]]}
