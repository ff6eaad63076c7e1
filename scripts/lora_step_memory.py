"""LoRA GRPO steps of the Qwen3-VL-4B config on random weights, live peak memory beside `vlmgym plan`'s.

    python scripts/lora_step_memory.py [--steps 3] [--config 4b] [--remat layer|none] [--phase learner|rollout]
                                       [--json PATH]

On the one accelerator JAX sees (a GPU: bf16 weights), with the OSV-5M LoRA recipe's shapes (128 completions =
16 prompts x group 8 in 8 micro-batches, 370-token prompts with a 512x672 image, 128 answer tokens, rank-16
adapters on the decoder's seven projections, `remat: layer`), the plan's programs are compiled for that device
and then run as the trainer runs them. `--phase learner`: `grpo_gradients` and `apply_update` (micro-batches
placed up front, gradients summed, one AdamW step on the adapters). `--phase rollout`: the sampling call (the
adapters merged into their kernels, prefill, decode loop). Prints one JSON object: the plan's peaks for this
device's compile, the allocator's measured peak (`peak_bytes_in_use`) and each step's or call's seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.models.qwen3_vl import lora
from vlmgym.models.qwen3_vl.mesh import shard_params
from vlmgym.models.qwen3_vl.weights import abstract_params
from vlmgym.plan.cli import run
from vlmgym.plan.model_spec import PlanSpec
from vlmgym.plan.programs import Planner
from vlmgym.plan.shapes import learner_micro, plan_config, rollout_prompts
from vlmgym.rl.policy import sampling_params
from vlmgym.rl.update import accumulate

GIB = 2**30
PHASE_PEAKS: dict[str, float] = {}  # sample(): the measured peak after each phase of the first call


def random_params(cfg, mesh, seed: int):
    """Normal(0, 0.02) weights drawn on the device in their own dtype (no fp32 copy), placed as the plan shards."""
    shapes = abstract_params(cfg)
    leaves, treedef = jax.tree.flatten(shapes)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    draw = jax.jit(lambda k, shape, dtype: 0.02 * jax.random.normal(k, shape, dtype), static_argnums=(1, 2))
    params = jax.tree.unflatten(treedef, [draw(k, leaf.shape, leaf.dtype) for k, leaf in zip(keys, leaves)])
    return shard_params(params, cfg, mesh)


def learn(planner, cfg, spec, params, opt_state, steps: int) -> tuple[list[float], list[float]]:
    """`steps` learner updates as the trainer runs them: micro-batches placed up front, gradients summed, AdamW."""
    rng = np.random.default_rng(0)
    micros = []
    for _ in range(spec.micro_batches):
        micro = learner_micro(cfg, spec)
        pixels = micro["batch"]["inputs"]["pixel_values"]
        micro["batch"]["inputs"]["pixel_values"] = rng.standard_normal(pixels.shape).astype(pixels.dtype)
        micro["batch"]["completion_ids"] = rng.integers(0, cfg.text.vocab_size, micro["mask"].shape, np.int32)
        micro["advantages"] = rng.standard_normal(micro["advantages"].shape).astype(np.float32)
        micro["behaviour"] = np.full(micro["mask"].shape, -np.log(cfg.text.vocab_size), np.float32)
        micro["batch"] = planner.policy._place(micro["batch"])  # as Qwen3VLPolicy.build_batch places it
        micros.append(micro)
    normalizer = jnp.float32(sum(float(m["mask"].sum()) for m in micros))
    gradients, update = planner.compiled["gradients"], planner.compiled["update"]
    seconds, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        grads, auxes = accumulate(lambda m, p=params: gradients(p, m, normalizer), micros)
        params, opt_state, _ = update(params, opt_state, grads)
        jax.block_until_ready(params)
        seconds.append(round(time.perf_counter() - t0, 3))
        losses.append(float(sum(float(a["loss"]) for a in auxes)))
    return seconds, losses


def sample(planner, cfg, spec, params, calls: int) -> list[float]:
    """`calls` sampling calls as the engine runs them: adapters merged into their kernels (policy.sampling_params)
    beside the adapted params, then the plan's compiled prefill and decode loop on random pixels."""
    rng = np.random.default_rng(0)
    prompts = rollout_prompts(cfg, spec)
    prompts["pixel_values"] = rng.standard_normal(prompts["pixel_values"].shape).astype(np.float32)
    prefill, decode = planner.compiled["rollout_prefill"], planner.compiled["rollout_decode"]
    seconds, device = [], jax.devices()[0]

    def peak(where: str) -> None:  # the allocator's high-water mark so far (the first call only)
        if not seconds and device.memory_stats():
            PHASE_PEAKS[where] = round(device.memory_stats()["peak_bytes_in_use"] / GIB, 2)

    for call in range(calls):
        t0 = time.perf_counter()
        merged = jax.block_until_ready(lora.strip(sampling_params(params)))
        peak("after_merge")
        logits, cache = jax.block_until_ready(prefill(merged, prompts))
        peak("after_prefill")
        tokens, cache = decode(merged, logits, cache, jax.random.key(call), jnp.ones(logits.shape[0], jnp.bool_),
                               jnp.int32(0))
        jax.block_until_ready(tokens)
        peak("after_decode")
        del merged, logits, cache  # the engine keeps only the tokens of a call
        seconds.append(round(time.perf_counter() - t0, 3))
    return seconds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="4b", choices=("2b", "4b", "8b", "tiny"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--remat", choices=("none", "layer"), default="layer")
    parser.add_argument("--phase", choices=("learner", "rollout"), default="learner",
                        help="rollout: one sampling call of the step (16 prompts x 8, adapters merged) instead")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    tiny = args.config == "tiny"
    dtype = "fp32" if tiny else "bf16"
    spec = PlanSpec(config=args.config, mesh=(1, 1, 1), batch=16 if tiny else 128, seq=20 if tiny else 370,
                    answer=8 if tiny else 128, group=8, micro_batches=2 if tiny else 8,
                    image=(64, 64) if tiny else (512, 672), remat=args.remat, algorithm="grpo", freeze="none",
                    lora_rank=16, dtype=dtype, param_dtype=dtype)
    device = jax.devices()[0]
    cfg = plan_config(spec.config, spec.dtype, spec.param_dtype)
    planner = Planner(cfg, spec)
    started = time.perf_counter()
    report = run(spec, rollout=args.phase == "rollout", planner=planner)
    compile_s = time.perf_counter() - started
    after_compile = (device.memory_stats() or {}).get("peak_bytes_in_use")

    params = lora.init_adapters(random_params(cfg, planner.mesh, seed=0), cfg, lora.LoRAConfig(rank=spec.lora_rank))
    params = jax.tree.map(lambda p, s: jax.device_put(p, s.sharding), params, planner.params)
    opt_state = planner.optimizer.init_placed(params)
    if args.phase == "rollout":
        seconds, losses = sample(planner, cfg, spec, params, args.steps), []
    else:
        seconds, losses = learn(planner, cfg, spec, params, opt_state, args.steps)
    stats = device.memory_stats() or {}
    out = {"device": f"{device.device_kind} (jax {jax.__version__})", "spec": report["spec"],
           "compile_s": round(compile_s, 1), "trainable_parameters": report["trainable_parameters"],
           "plan_gib": {name: round(v / GIB, 2) for name, v in report["peak"].items()},
           "plan_state_gib": {name: round(v / GIB, 2) for name, v in report["state"].items()},
           "plan_programs_gib": {name: {k: round(v / GIB, 2) for k, v in m.items()}
                                 for name, m in report["programs"].items()},
           "measured_peak_gib": round(stats.get("peak_bytes_in_use", 0) / GIB, 2) if stats else None,
           "peak_after_compile_gib": round(after_compile / GIB, 2) if after_compile else None,
           "in_use_after_gib": round(stats.get("bytes_in_use", 0) / GIB, 2) if stats else None,
           "phase": args.phase, "phase_peaks_gib": PHASE_PEAKS, "step_seconds": seconds, "losses": losses}
    text = json.dumps(out, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
