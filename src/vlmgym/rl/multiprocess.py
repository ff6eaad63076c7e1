"""The GRPO trainer over several processes (vlmgym.runtime.distributed): what it supports, and each step's sampled
groups gathered from every process."""

from __future__ import annotations

from typing import Any

import numpy as np

from vlmgym.params import TrainParams
from vlmgym.runtime import distributed

MULTIPROCESS_ALGORITHMS = ("grpo", "rloo")


def check_multiprocess(config: TrainParams, policy: Any) -> None:
    """What a run over several processes supports (JAX's multi-controller runtime: vlmgym.runtime.distributed)."""
    processes = distributed.count()
    if config.algorithm not in MULTIPROCESS_ALGORITHMS:
        raise ValueError(f"train.algorithm={config.algorithm!r} runs in one process; over {processes} processes "
                         f"train supports {', '.join(MULTIPROCESS_ALGORITHMS)}")
    if config.batch_prompts % processes:
        raise ValueError(f"train.batch_prompts={config.batch_prompts} must split evenly over {processes} processes "
                         "(each samples its own prompts' groups)")
    if getattr(policy, "mesh", None) is None:
        raise ValueError(f"a run over {processes} processes needs a device mesh over all of them (train.mesh)")


def any_process(flag: bool) -> bool:
    """Whether `flag` holds on any process (this process's flag in a single-process run)."""
    return any(distributed.gather_json(bool(flag))) if distributed.count() > 1 else bool(flag)


def gathered_collection(local: dict) -> dict:
    """Every process's `_collect` result merged, as one process sampling the whole step would return it: the
    groups in process order (the order of the step's prompts; a group another process sampled has no observation,
    obs None), counts summed, everything sampled concatenated."""
    groups = local["groups"]
    described = [{"index": g["index"], "texts": list(g["texts"]), "infos": g["infos"],
                  "padding": g.get("padding", False)} for g in groups]
    arrays = {name: distributed.gather_rows(np.stack([g[name] for g in groups]))
              for name in ("tokens", "mask", "logprobs", "rewards")}
    sampled = {name: distributed.gather_rows(np.asarray(local[name], np.float64))
               for name in ("sampled_rewards", "final_rewards")}
    # Only with train.overlong_buffer on (the same on every process): no collective for an empty list.
    sampled["overlong_penalty"] = (distributed.gather_rows(np.asarray(local["overlong_penalty"], np.float64))
                                   if local["overlong_penalty"] else np.zeros(0))
    counts = ("sampled_groups", "zero_std_groups", "sampled_tokens", "num_padding", "groups_filtered")
    figures = distributed.gather_json({"groups": described, "rollout_time": local["rollout_time"],
                                       "infos": local["sampled_infos"], "texts": local["sampled_texts"],
                                       **{name: local[name] for name in counts}})
    observations = [None] * sum(len(f["groups"]) for f in figures)
    first = sum(len(f["groups"]) for f in figures[:distributed.index()])
    observations[first: first + len(groups)] = [g["obs"] for g in groups]
    described = [g for f in figures for g in f["groups"]]
    merged = [{**described[i], "obs": observations[i], **{name: arrays[name][i] for name in arrays}}
              for i in range(len(described))]
    return {"groups": merged, "rounds": local["rounds"], "rollout_time": max(f["rollout_time"] for f in figures),
            **{name: sum(f[name] for f in figures) for name in counts}, **sampled,
            "sampled_infos": [i for f in figures for i in f["infos"]],
            "sampled_texts": [t for f in figures for t in f["texts"]]}
