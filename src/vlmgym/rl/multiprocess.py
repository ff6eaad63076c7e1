"""The GRPO trainer over several processes (vlmgym.runtime.distributed): what it supports (each step's sampled
groups are gathered from every process by vlmgym.rl.sampling.gathered)."""

from __future__ import annotations

from typing import Any

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
