"""`vlmgym bench learner`: the GRPO learner update with one prompt copy per completion vs one per group.

    vlmgym bench learner [--prompts 8] [--group 8] [--completion-tokens 48] [--repeats 5] [--skip-4b]

Three cases, one JSON object:
- `tiny_default`: the pipeline's tiny model on geospot-style prompts (256x192 images: 12 image tokens);
- `large_image`: the same dimensions with a larger pixel budget (384x288 images: 108 image tokens), closer
  to a real model's prompt-to-answer ratio;
- `qwen3_vl_4b`: the 4B config at the recipe's micro-batch (2 prompts x 8, 672x512 images, 128 answer
  tokens), compiled for abstract weights on the CPU (nothing allocated, nothing run): XLA's FLOP count and
  temporary (activation) bytes of each update.
Each timed case runs the trainer's jitted `grpo_gradients` (forward, GRPO loss, backward, fp32 gradients) on
the same batch both ways, best of `--repeats` after a compile; tokens/s counts the completion tokens scored;
`roofline_fraction` is XLA's FLOP count of the program over its time, against this machine's best square
matmul rate (`useful_roofline_fraction` counts the shared program's FLOPs for both: the work either needs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.bench.common import measure_matmul_flops, measure_numpy_matmul_flops, synthetic_obs

LARGE_IMAGE = (384, 288)  # width, height: 24 x 18 patches, 108 image tokens after the 2x2 merge


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vlmgym bench learner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per update (the default batch_prompts)")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (group_size)")
    parser.add_argument("--completion-tokens", type=int, default=48,
                        help="answer tokens per completion (the default geospot answer is ~39, at most ~47)")
    parser.add_argument("--repeats", type=int, default=5, help="timed updates per variant (best is reported)")
    parser.add_argument("--skip-4b", action="store_true", help="leave out the compiled 4B counts")
    args = parser.parse_args(argv)
    if min(args.prompts, args.group, args.completion_tokens, args.repeats) < 1:
        parser.error("--prompts, --group, --completion-tokens and --repeats must be >= 1")
    return args


def _tiny_model(folder: Path, max_pixels: int) -> tuple[Any, Any, Any]:
    """(cfg, params, processor) of the pipeline's tiny default model, with the given pixel budget."""
    import jax
    import jax.numpy as jnp

    from vlmgym.envs import corpus
    from vlmgym.models.qwen3_vl.base_model import build_base_model
    from vlmgym.models.qwen3_vl.config import load_hf_config
    from vlmgym.models.qwen3_vl.convert import hf_to_params, read_safetensors
    from vlmgym.models.qwen3_vl.processor import Processor
    from vlmgym.params import ModelParams, from_dict

    build_base_model(from_dict(ModelParams, {"hf_dir": str(folder), "max_pixels": max_pixels}), corpus=corpus())
    cfg = load_hf_config(folder)
    params = jax.tree.map(jnp.asarray, hf_to_params(read_safetensors(folder), cfg))
    return cfg, params, Processor.from_pretrained(folder)


def _gradient_fn(policy: Any, params: Any) -> tuple[Any, Any]:
    """The trainer's jitted GRPO gradients for `policy`, as f(params, micro) -> (loss, grads, aux)."""
    import jax.numpy as jnp

    from vlmgym.params import ObjectiveParams
    from vlmgym.rl.loop import CompileCounter
    from vlmgym.rl.optim import Optimizer, OptimizerConfig, trainable_mask
    from vlmgym.rl.update import grpo_gradients

    optimizer = Optimizer(OptimizerConfig(learning_rate=1e-4), trainable_mask(params))
    objective = ObjectiveParams()  # the loss's defaults: clip 0.2 / 0.28, token mean, no KL
    compiles = CompileCounter()

    def run(p: Any, micro: dict) -> Any:
        return grpo_gradients(p, micro, jnp.float32(micro["mask"].sum()), policy=policy, optimizer=optimizer,
                              objective=objective, compiles=compiles)

    def lowered(p: Any, micro: dict) -> Any:
        return grpo_gradients.lower(p, micro, jnp.float32(0), policy=policy, optimizer=optimizer, objective=objective,
                                    compiles=compiles)

    return run, lowered


def _micro(batch: dict, rows: int, steps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = batch["completion_mask"]
    return {"batch": batch, "mask": mask, "behaviour": np.full(mask.shape, -2.0, np.float32) * mask,
            "advantages": rng.standard_normal(rows).astype(np.float32)}


def _flops(compiled: Any) -> float:
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return float(analysis.get("flops", 0.0))


def time_case(cfg: Any, params: Any, processor: Any, args: argparse.Namespace, image_size: tuple[int, int],
              peak: float) -> dict[str, Any]:
    """Time the per-copy and the shared GRPO gradients of one batch on this model."""
    import jax

    from vlmgym.rl.policy import Qwen3VLPolicy
    from vlmgym.rollout.sampling import SamplingSettings

    settings = SamplingSettings(max_new_tokens=args.completion_tokens, eos_ids=tuple(processor.eos_token_ids),
                                pad_id=int(processor.pad_token_id))
    obs = synthetic_obs(args.prompts, width=image_size[0], height=image_size[1])
    rows = args.prompts * args.group
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.text.vocab_size, (rows, args.completion_tokens)).astype(np.int32)
    tokens[tokens == cfg.image_token_id] = 0
    mask = np.ones(tokens.shape, np.float32)
    out: dict[str, Any] = {"image_size": list(image_size), "rows": rows, "completion_tokens": int(mask.sum())}
    results = {}
    for name, share in (("per_copy", False), ("shared", True)):
        policy = Qwen3VLPolicy(cfg, processor, settings, share_prefix=share)
        batch = policy.build_batch(obs, tokens, mask)
        micro = _micro(batch, rows, args.completion_tokens)
        run, lowered = _gradient_fn(policy, params)
        started = time.perf_counter()
        jax.block_until_ready(run(params, micro))
        compile_s = time.perf_counter() - started
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            jax.block_until_ready(run(params, micro))
            times.append(time.perf_counter() - started)
        flops = _flops(lowered(params, micro).compile())
        best = min(times)
        results[name] = {"step_s": best, "step_s_all": times, "compile_s": compile_s - best,
                         "tokens_per_s": float(mask.sum()) / best, "flops": flops,
                         "roofline_fraction": flops / best / peak,
                         "prompt_tokens": int(np.asarray(batch["inputs"]["attention_mask"]).sum()),
                         "image_patches_run": int(len(batch["inputs"]["pixel_values"]))}
    for name in results:
        results[name]["useful_roofline_fraction"] = results["shared"]["flops"] / results[name]["step_s"] / peak
    out.update(results)
    out["prompt_tokens_per_prompt"] = results["shared"]["prompt_tokens"] / args.prompts
    out["speedup"] = results["per_copy"]["step_s"] / results["shared"]["step_s"]
    out["flop_ratio"] = results["per_copy"]["flops"] / results["shared"]["flops"]
    return out


def _per_copy_inputs(inputs: dict, group: int) -> dict:
    """Each prompt of a synthetic batch repeated `group` times, its images with it (the per-copy layout)."""
    grids = np.asarray(inputs["image_grid_thw"])
    sizes = grids.prod(axis=1)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    order = np.repeat(np.arange(len(grids)), group)
    pixels = np.concatenate([inputs["pixel_values"][starts[i]:starts[i + 1]] for i in order])
    return {"input_ids": np.repeat(inputs["input_ids"], group, axis=0),
            "attention_mask": np.repeat(inputs["attention_mask"], group, axis=0),
            "position_ids": np.repeat(inputs["position_ids"], group, axis=1),
            "pixel_values": pixels, "image_grid_thw": grids[order]}


def compiled_4b(args: argparse.Namespace) -> dict[str, Any]:
    """FLOPs and temporary bytes of the 4B update at the recipe's micro-batch, compiled for abstract weights."""
    import jax

    from vlmgym.bench.common import synthetic_token_inputs
    from vlmgym.models.qwen3_vl.config import CONFIGS_DIR, load_hf_config
    from vlmgym.models.qwen3_vl.weights import init_params
    from vlmgym.rl.policy import Qwen3VLLearner
    from vlmgym.rollout.sampling import SamplingSettings

    prompts, group, steps = 2, 8, 128  # configs/qwen3vl_4b_osv5m.yaml: 16 rows per micro-batch, 128 new tokens
    cfg = load_hf_config(CONFIGS_DIR / "qwen3_vl_4b.json", "bf16", "bf16")
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    shared_inputs = synthetic_token_inputs(cfg, prompts, (512, 672))
    rows = prompts * group
    tokens = np.zeros((rows, steps), np.int32)
    mask = np.ones((rows, steps), np.float32)
    out: dict[str, Any] = {"config": "qwen3_vl_4b (bf16)", "prompts": prompts, "group_size": group,
                           "completion_tokens": steps,
                           "prompt_tokens": int(shared_inputs["prompt_lengths"].mean())}
    policy = Qwen3VLLearner(cfg, SamplingSettings(max_new_tokens=1, eos_ids=(0,)))  # no tokenizer needed
    for name, inputs in (("per_copy", _per_copy_inputs(shared_inputs, group)), ("shared", shared_inputs)):
        inputs = policy._with_patch_layout(inputs)
        batch = {"inputs": {k: inputs[k] for k in ("input_ids", "attention_mask", "position_ids", "pixel_values",
                                                   "patch_layout")},
                 "completion_ids": tokens, "completion_mask": mask}
        _, lowered = _gradient_fn(policy, params)
        started = time.perf_counter()
        compiled = lowered(params, _micro(batch, rows, steps)).compile()
        memory = compiled.memory_analysis()
        out[name] = {"flops": _flops(compiled), "temp_bytes": int(memory.temp_size_in_bytes),
                     "compile_s": time.perf_counter() - started}
    out["flop_ratio"] = out["per_copy"]["flops"] / out["shared"]["flops"]
    out["temp_bytes_ratio"] = out["per_copy"]["temp_bytes"] / out["shared"]["temp_bytes"]
    return out


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    import jax

    square = measure_matmul_flops(2048, 2048, 2048)
    peak = max(square["best"], measure_numpy_matmul_flops(2048))
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "device": str(jax.devices()[0]), "prompts": args.prompts, "group_size": args.group,
                              "matmul_peak_flops_per_s": peak}
    with tempfile.TemporaryDirectory(prefix="vlmgym-bench-learner-") as tmp:
        default = _tiny_model(Path(tmp) / "tiny", 128 * 96)
        report["tiny_default"] = time_case(*default, args, (256, 192), peak)
        large = _tiny_model(Path(tmp) / "large", LARGE_IMAGE[0] * LARGE_IMAGE[1])
        report["large_image"] = time_case(*large, args, LARGE_IMAGE, peak)
    if not args.skip_4b:
        report["qwen3_vl_4b"] = compiled_4b(args)
    return report


def main(argv: list[str]) -> int:
    """Entry point of `vlmgym bench learner`."""
    args = parse_args(argv)
    with contextlib.redirect_stdout(sys.stderr):  # the trainer's compile messages: stdout is the JSON alone
        report = run_benchmark(args)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
