"""LoRA rollout: sampling with the adapters applied in every decode step vs merging them into the kernels before the
rollout phase. Run from the repository root: python scripts/lora_rollout_time.py [--skip-tiny] [--skip-4b]

tiny: the pipeline's tiny default model (fp32, one device), 8 prompts x G=8, 48 new tokens (the rollout benchmark's
shapes), rank 8 on q/k/v/o/gate/up/down, best of --repeats whole generate calls each, plus the merge's own time.
4b: the Qwen3-VL-4B config (bf16, random weights never allocated): XLA's cost analysis of one compiled decode step
(128 rows, a 640-token cache) with and without rank-16 adapters, and of the merge (FLOPs and bytes moved).
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.models.qwen3_vl import lora


def _random_b(params, scale=0.05):
    def leaf(path, x):
        if getattr(path[-1], "key", None) != "lora_b":
            return x
        return scale * jax.random.normal(jax.random.key(len(jax.tree_util.keystr(path))), x.shape, x.dtype)
    return jax.tree_util.tree_map_with_path(leaf, params)


def tiny(repeats: int) -> dict:
    from vlmgym.bench.common import build_default_model, synthetic_obs
    from vlmgym.models.qwen3_vl.config import load_hf_config
    from vlmgym.models.qwen3_vl.convert import hf_to_params, read_safetensors
    from vlmgym.models.qwen3_vl.processor import Processor
    from vlmgym.rollout.engine import Buckets, RolloutEngine
    from vlmgym.rollout.sampling import SamplingSettings

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_default_model(Path(tmp) / "tiny")
        cfg = load_hf_config(folder)
        params = jax.tree.map(jnp.asarray, hf_to_params(read_safetensors(folder), cfg))
        processor = Processor.from_pretrained(folder)
    obs = synthetic_obs(8)
    inputs = processor([o["messages"] for o in obs], [o["images"] for o in obs], buckets=Buckets().prompt_lengths)
    tok = processor.tokenizer
    eos = (tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>"))
    settings = SamplingSettings(max_new_tokens=48, temperature=0.7, top_k=20, top_p=0.8, eos_ids=eos,
                                pad_id=int(processor.pad_token_id))
    adapted = _random_b(lora.init_adapters(params, cfg, lora.LoRAConfig(rank=8)))
    merge = jax.jit(lora.merge)
    trees = {"base": params, "adapters_in_decode": adapted, "merged": merge(adapted)}
    engines = {name: RolloutEngine(cfg, processor, settings, devices=jax.devices()[:1]) for name in trees}
    for name, tree in trees.items():
        engines[name].generate_from_inputs(tree, inputs, 8, jax.random.key(1))  # compile
    times = {name: [] for name in trees}
    for r in range(repeats):  # interleaved, so load from other processes hits every variant alike
        for name, tree in trees.items():
            start = time.perf_counter()
            batch = engines[name].generate_from_inputs(tree, inputs, 8, jax.random.key(2 + r))
            times[name].append(time.perf_counter() - start)
    out = {name: {"best_s": min(t), "median_s": float(np.median(t)), "tokens": int(batch.completion_mask.sum()),
                  "tokens_per_s_best": int(batch.completion_mask.sum()) / min(t)} for name, t in times.items()}
    merge_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(merge(adapted))
        merge_times.append(time.perf_counter() - start)
    out["merge_best_s"] = min(merge_times)
    out["merged_plus_merge_s"] = out["merged"]["best_s"] + out["merge_best_s"]
    return out


def four_b(rank: int = 16, rows: int = 128, cache: int = 640) -> dict:
    from vlmgym.models.qwen3_vl.model import decode_step
    from vlmgym.models.qwen3_vl.weights import abstract_params
    from vlmgym.plan.shapes import plan_config

    cfg = plan_config("4b", "bf16", "bf16")
    base = abstract_params(cfg)
    adapted = jax.eval_shape(lambda p: lora.init_adapters(p, cfg, lora.LoRAConfig(rank=rank)), base)
    t = cfg.text
    kv = jax.ShapeDtypeStruct((t.num_hidden_layers, rows, cache, t.num_key_value_heads, t.head_dim), jnp.bfloat16)
    cache_tree = {"k": kv, "v": kv, "valid": jax.ShapeDtypeStruct((rows, cache), jnp.bool_),
                  "index": jax.ShapeDtypeStruct((), jnp.int32),
                  "next_position": jax.ShapeDtypeStruct((rows,), jnp.int32)}
    tokens = jax.ShapeDtypeStruct((rows,), jnp.int32)
    out = {"rank": rank, "rows": rows, "cache": cache}
    for name, tree in (("merged_or_base", base), ("adapters_in_decode", adapted)):
        started = time.perf_counter()
        compiled = jax.jit(decode_step, static_argnums=1).lower(tree, cfg, tokens, cache_tree).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        out[name] = {"flops": float(cost.get("flops", 0)), "bytes_accessed": float(cost.get("bytes accessed", 0)),
                     "compile_s": round(time.perf_counter() - started, 1)}
    cost = jax.jit(lora.merge).lower(adapted).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    out["merge"] = {"flops": float(cost.get("flops", 0)), "bytes_accessed": float(cost.get("bytes accessed", 0))}
    kernels = sum(int(np.prod(lora._get(adapted, p)["kernel"].shape)) for p in lora.adapted_paths(adapted))
    out["adapted_kernel_bytes_bf16"] = 2 * kernels
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--skip-tiny", action="store_true")
    parser.add_argument("--skip-4b", action="store_true")
    args = parser.parse_args(argv)
    report = {"device": str(jax.devices()[0]), "jax": jax.__version__}
    if not args.skip_tiny:
        report["tiny"] = tiny(args.repeats)
    if not args.skip_4b:
        report["4b"] = four_b()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
