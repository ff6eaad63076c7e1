"""Run by test_plan.py with 2 fake CPU devices: `vlmgym plan`'s figures for the tiny model against a real step.

Prints one JSON line: the plan's per-device bytes, the live per-device bytes of the same programs' real arguments
and outputs (the trainer's own jitted functions on real, sharded weights), and whether the optimizer state is
laid out like the params.
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.models.qwen3_vl.mesh import shard_params
from vlmgym.models.qwen3_vl.weights import abstract_params
from vlmgym.plan.cli import run, table
from vlmgym.plan.model_spec import PlanSpec
from vlmgym.plan.programs import Planner
from vlmgym.plan.shapes import learner_micro, plan_config

SPEC = PlanSpec(config="tiny", mesh=(1, 2, 1), batch=4, seq=20, answer=8, group=2, image=(64, 64), freeze="vision")


def live_bytes(tree, device):
    """Bytes on `device` of a call's arguments or outputs: a jax.Array's shards there; a host array is copied to
    every device of the program."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            total += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == device)
        else:
            total += np.asarray(leaf).nbytes
    return total


def equivalent(a, b):
    return all(x.sharding.is_equivalent_to(y.sharding, x.ndim) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main():
    assert jax.device_count() == 2
    cfg = plan_config(SPEC.config)
    planner = Planner(cfg, SPEC)  # the plan and the real calls share static arguments (and compiled programs)
    started = time.perf_counter()
    report = run(SPEC, rollout=False, planner=planner)
    print(table(report), file=sys.stderr)
    print(f"plan: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    # Weights' values do not matter here, only their buffers (init_params would take longer than the plan).
    params = shard_params(jax.tree.map(lambda a: np.full(a.shape, 0.01, a.dtype), abstract_params(cfg)), cfg,
                          planner.mesh)
    micro = learner_micro(cfg, SPEC)
    pixels = micro["batch"]["inputs"]["pixel_values"]
    micro["batch"]["inputs"]["pixel_values"] = np.zeros(pixels.shape, pixels.dtype)
    micro["batch"] = planner.policy._place(micro["batch"])  # as Qwen3VLPolicy.build_batch places it on a mesh
    normalizer = jnp.float32(micro["mask"].sum())
    device = jax.devices()[0]
    args = (params, micro, normalizer)
    # The plan's own compiled gradient program (grpo_gradients for these static arguments), run on the real
    # arguments as the trainer passes them: it refuses arguments laid out otherwise than the plan assumed.
    outputs = planner.compiled["gradients"](*args)
    live = {"gradients": {"arguments": live_bytes(args, device), "outputs": live_bytes(outputs, device)}}
    opt_state = planner.optimizer.init_placed(params)  # what the trainers hold
    state_bytes = {"device": live_bytes(opt_state, device),
                   "total": sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(opt_state))}
    update_args = (params, opt_state, outputs[1])
    arg_bytes = live_bytes(update_args, device)
    new_params, new_state, stats = planner.compiled["update"](*update_args)  # apply_update, params donated
    live["update"] = {"arguments": arg_bytes, "outputs": live_bytes((new_params, new_state, stats), device)}
    print(f"plan + real step: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    print(json.dumps({"plan": report, "live": live, "opt_state_bytes": state_bytes,
                      "opt_state_like_plan": equivalent(opt_state, planner.opt_state()),
                      "memory_stats": device.memory_stats()}))


if __name__ == "__main__":
    main()
