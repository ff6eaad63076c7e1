"""`vlmgym bench rollout`: the JAX rollout engine against transformers `generate`, same weights, same prompts.

    vlmgym bench rollout [--model DIR] [--prompts 8] [--group 8] [--max-new-tokens 48] [--dtype fp32|bf16]
                         [--devices N]
    vlmgym bench rollout --config 4b --random-weights --dtype bf16 --prompts 8 --group 8   # GPU, see BENCHMARKS.md

Each side runs in its own process (its own peak memory, thread pools and accelerator allocator) on inputs the
parent builds once and passes as an .npz. Throughput runs sample groups with the hub's sampling settings and no
EOS, so every sequence produces exactly max_new_tokens on both sides; the greedy check (fp32: asserted) uses the
model's EOS ids. On a CPU the JAX side splits the prompts over one host device per core (`--devices`, default:
the cores this process may use), each decoding its share concurrently. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.bench.common import (
    build_default_model,
    decode_bytes_per_step,
    decode_flops_per_token,
    measure_matmul_flops,
    measure_numpy_matmul_flops,
    peak_memory_bytes,
    sampling_from_args,
    synthetic_obs,
    synthetic_token_inputs,
)

INPUT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw", "position_ids",
              "rope_deltas", "prompt_lengths")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vlmgym bench rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="HF Qwen3-VL folder (default: build the tiny default model)")
    parser.add_argument("--config", default="",
                        help="instead of --model: a shipped real config (2b/4b/8b) or a config.json path")
    parser.add_argument("--random-weights", action="store_true", help="with --config: random weights (no download)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (group_size)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--top-p", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per side (best is reported)")
    parser.add_argument("--hbm-bandwidth", type=float, default=4.8e12, help="bytes/s for the GPU roofline (H200)")
    parser.add_argument("--image-size", type=int, default=256, help="square image side for --config prompts")
    parser.add_argument("--devices", type=int, default=0,
                        help="CPU: split the prompts over this many host devices decoding concurrently, one per core "
                             "(default: the cores this process may use); a GPU runs on one device")
    parser.add_argument("--skip-hf", action="store_true", help="only the JAX side")
    parser.add_argument("--worker", choices=("jax", "hf"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.config and not args.random_weights:
        parser.error("--config needs --random-weights (real weights: pass --model DIR)")
    if args.config and args.model:
        parser.error("give --model or --config, not both")
    if args.devices < 0:
        parser.error("--devices must be >= 0 (0: one per core)")
    return args


def _prepare(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Resolve the model, build the prompts once, and write the spec both workers read."""
    spec: dict[str, Any] = {"dtype": args.dtype, "group_size": args.group, "max_new_tokens": args.max_new_tokens,
                            "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
                            "repeats": args.repeats, "hbm_bandwidth": args.hbm_bandwidth,
                            "devices": args.devices or len(os.sched_getaffinity(0)),
                            "check_greedy": args.dtype == "fp32" or not args.config}
    if args.config:
        from vlmgym.models.qwen3_vl.config import CONFIGS_DIR, load_hf_config

        path = Path(args.config)
        if not path.suffix:  # a shipped config name
            path = CONFIGS_DIR / f"qwen3_vl_{args.config.lower()}.json"
        cfg = load_hf_config(path)
        text = json.loads(path.read_text())["text_config"]
        # Qwen's ids: <|im_end|> ends a turn, <|endoftext|> (the "bos" in the config) pads and ends too.
        eos, endoftext = text.get("eos_token_id", 151645), text.get("bos_token_id", 151643)
        spec.update(random_config=str(path), model=f"{args.config} (random weights)", eos_ids=[eos, endoftext],
                    pad_id=text.get("pad_token_id") or endoftext, check_greedy=False)
        inputs = synthetic_token_inputs(cfg, args.prompts, (args.image_size, args.image_size))
    else:
        from vlmgym.models.qwen3_vl.processor import Processor
        from vlmgym.rollout.engine import Buckets

        model_dir = Path(args.model) if args.model else build_default_model(workdir / "tiny-default")
        processor = Processor.from_pretrained(model_dir)
        obs = synthetic_obs(args.prompts)
        inputs = processor([o["messages"] for o in obs], [o["images"] for o in obs],
                           buckets=Buckets().prompt_lengths)
        tokenizer = processor.tokenizer
        eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
        spec.update(model_dir=str(model_dir), model=str(model_dir) if args.model else "tiny default",
                    eos_ids=eos, pad_id=int(processor.pad_token_id))
    np.savez(workdir / "inputs.npz", **{k: np.asarray(inputs[k]) for k in INPUT_KEYS if k in inputs})
    spec["inputs"] = str(workdir / "inputs.npz")
    (workdir / "spec.json").write_text(json.dumps(spec))
    return spec


def _run_worker(side: str, workdir: Path, host_devices: int = 1) -> dict[str, Any]:
    """Run one side in a fresh interpreter; its last stdout line is its JSON result.

    host_devices: how many CPU devices XLA shows the JAX side (the flag must be set before JAX starts).
    """
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    flags = env.get("XLA_FLAGS", "")
    if host_devices > 1 and "xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={host_devices}".strip()
    proc = subprocess.run([sys.executable, "-m", "vlmgym.bench.rollout", "--worker", side, "--spec",
                           str(workdir / "spec.json")], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} benchmark worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _greedy_lengths(tokens: np.ndarray, eos_ids: list[int]) -> np.ndarray:
    """Tokens up to and including the first EOS (or all), per row."""
    is_eos = np.isin(tokens, eos_ids)
    first = np.where(is_eos.any(axis=1), is_eos.argmax(axis=1) + 1, tokens.shape[1])
    return first.astype(np.int64)


def compare_greedy(jax_tokens: list[list[int]], hf_tokens: list[list[int]], eos_ids: list[int]) -> dict[str, Any]:
    """Row-by-row comparison of greedy completions, each cut after its first EOS."""
    rows, matches, first_diff = len(jax_tokens), 0, None
    for row, (a, b) in enumerate(zip(jax_tokens, hf_tokens)):
        a, b = np.asarray(a), np.asarray(b)
        a = a[:_greedy_lengths(a[None], eos_ids)[0]]
        b = b[:_greedy_lengths(b[None], eos_ids)[0]]
        if np.array_equal(a, b):
            matches += 1
        elif first_diff is None:
            n = min(len(a), len(b))
            pos = int(np.argmax(a[:n] != b[:n])) if (a[:n] != b[:n]).any() else n
            first_diff = {"row": row, "position": pos, "jax": a[pos:pos + 4].tolist(), "hf": b[pos:pos + 4].tolist()}
    return {"greedy_rows_equal": matches, "greedy_rows": rows, "greedy_equal": matches == rows,
            "greedy_first_difference": first_diff}


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Both sides on the same inputs; the combined report."""
    with tempfile.TemporaryDirectory(prefix="vlmgym-bench-") as tmp:
        workdir = Path(tmp)
        spec = _prepare(args, workdir)
        jax_result = _run_worker("jax", workdir, spec["devices"])
        hf_result = None if args.skip_hf else _run_worker("hf", workdir)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "model": spec["model"], "dtype": args.dtype,
        "prompts": args.prompts, "group_size": args.group, "max_new_tokens": args.max_new_tokens,
        "sampling": {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p},
        "jax": {k: v for k, v in jax_result.items() if k != "greedy_tokens"},
    }
    if hf_result is not None:
        report["hf"] = {k: v for k, v in hf_result.items() if k != "greedy_tokens"}
        report["speedup_vs_hf"] = jax_result["tokens_per_s"] / hf_result["tokens_per_s"]
        if spec["check_greedy"]:
            report.update(compare_greedy(jax_result["greedy_tokens"], hf_result["greedy_tokens"], spec["eos_ids"]))
    return report


def main(argv: list[str]) -> int:
    """Entry point of `vlmgym bench rollout`."""
    args = parse_args(argv)
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        with np.load(spec["inputs"], allow_pickle=False) as data:
            inputs = {k: data[k] for k in data.files}
        if args.worker == "jax":
            result = run_jax(spec, inputs)
        else:
            from vlmgym.bench.hf import run as run_hf

            result = run_hf(spec, inputs)
        print(json.dumps(result))
        return 0
    report = run_benchmark(args)
    print(json.dumps(report, indent=2))
    if args.dtype == "fp32" and report.get("greedy_equal") is False:
        print("vlmgym bench rollout: greedy outputs of JAX and transformers differ in fp32", file=sys.stderr)
        return 1
    return 0


def _load_jax_model(spec: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(cfg, params, processor) for the JAX side: converted in memory from the HF folder, or random weights."""
    import jax
    import jax.numpy as jnp

    from vlmgym.models.qwen3_vl.config import load_hf_config

    if spec.get("random_config"):
        from vlmgym.models.qwen3_vl.weights import init_params

        cfg = load_hf_config(spec["random_config"], spec["dtype"], spec["dtype"])
        params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
        return cfg, params, None
    from vlmgym.models.qwen3_vl.convert import hf_to_params, read_safetensors
    from vlmgym.models.qwen3_vl.processor import Processor

    cfg = load_hf_config(spec["model_dir"], spec["dtype"], spec["dtype"])
    params = jax.tree.map(lambda a: jnp.asarray(a, cfg.params_dtype), hf_to_params(read_safetensors(spec["model_dir"]),
                                                                                    cfg))
    return cfg, params, Processor.from_pretrained(spec["model_dir"])


def hbm_figures(cfg: Any, rows: int, context: float, steps: int, decode_s: float, bandwidth: float) -> dict[str, float]:
    """GPU roofline: bytes a decode step must read (weights + KV) over the measured step time, vs bandwidth."""
    import jax.numpy as jnp

    width = jnp.dtype(cfg.compute_dtype).itemsize
    per_step_s = decode_s / steps
    moved = decode_bytes_per_step(cfg, rows, context, width, width)
    return {"decode_step_s": per_step_s, "bytes_per_step": moved, "hbm_bandwidth": bandwidth,
            "hbm_roofline_fraction": moved / per_step_s / bandwidth}


def run_jax(spec: dict[str, Any], inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """The JAX engine: greedy outputs, compile time, time to first token, throughput, roofline figures."""
    import jax

    from vlmgym.rollout.engine import TRACE_COUNTS, RolloutEngine
    from vlmgym.rollout.sampling import SamplingSettings

    on_gpu = jax.devices()[0].platform == "gpu"
    devices = jax.devices()[:1] if on_gpu else jax.devices()[:int(spec.get("devices", 1))]
    cfg, params, processor = _load_jax_model(spec)
    result: dict[str, Any] = {"device": str(jax.devices()[0]), "devices": len(devices)}
    if spec.get("check_greedy"):
        greedy = RolloutEngine(cfg, processor, SamplingSettings(
            max_new_tokens=spec["max_new_tokens"], greedy=True, eos_ids=tuple(spec["eos_ids"]), pad_id=spec["pad_id"]),
            devices=devices)
        greedy_batch = greedy.generate_from_inputs(params, inputs, 1, jax.random.key(0))
        result["greedy_tokens"] = greedy_batch.completion_ids.tolist()
    engine = RolloutEngine(cfg, processor, sampling_from_args(spec), devices=devices)
    group_size = int(spec["group_size"])
    compiles_before = sum(TRACE_COUNTS.values())
    start = time.perf_counter()
    engine.generate_from_inputs(params, inputs, group_size, jax.random.key(1))
    cold_s = time.perf_counter() - start
    compiles_warmup = sum(TRACE_COUNTS.values()) - compiles_before
    times, first_token = [], []
    for repeat in range(int(spec["repeats"])):
        start = time.perf_counter()  # the whole call: host prep, prefill, decode loop, results and texts
        batch = engine.generate_from_inputs(params, inputs, group_size, jax.random.key(2 + repeat))
        times.append(time.perf_counter() - start)
        first_token.append(batch.timings["prefill_s"])
    best = min(times)
    generated = int(batch.completion_mask.sum())
    tokens_per_s = generated / best
    steps = int(spec["max_new_tokens"])
    context = float(np.mean(inputs["prompt_lengths"])) + (steps + 1) / 2
    flops = decode_flops_per_token(cfg, context)
    result.update({
        "generated_tokens": generated, "seconds": best, "seconds_all": times, "tokens_per_s": tokens_per_s,
        "compile_s": cold_s - best, "time_to_first_token_s": min(first_token),
        "compiles_warmup": compiles_warmup,
        "recompiles": sum(TRACE_COUNTS.values()) - compiles_before - compiles_warmup,
        "peak_memory_bytes": peak_memory_bytes("jax" if on_gpu else None),
        "prompt_tokens_mean": float(np.mean(inputs["prompt_lengths"])),
        "prompt_bucket": int(inputs["input_ids"].shape[1]),
        "model_flops_per_token": flops, "achieved_flops_per_s": flops * tokens_per_s,
    })
    if on_gpu:
        result.update(hbm_figures(cfg, int(inputs["input_ids"].shape[0]) * group_size, context, steps,
                                  best - min(first_token), float(spec["hbm_bandwidth"])))
    else:
        # The roofline is the best large square fp32 matmul this machine does (JAX or numpy's BLAS);
        # a decode-sized one (rows x hidden @ hidden x ffn) shows what the model's shapes allow.
        square = measure_matmul_flops(2048, 2048, 2048)
        blas = measure_numpy_matmul_flops(2048)
        rows = int(inputs["input_ids"].shape[0]) * group_size
        decode_sized = measure_matmul_flops(rows, cfg.text.hidden_size, cfg.text.intermediate_size)
        peak = max(square["best"], blas)
        result.update({
            "matmul_peak_flops_per_s": peak, "matmul_square_jax_flops_per_s": square,
            "matmul_square_numpy_flops_per_s": blas, "matmul_decode_sized_flops_per_s": decode_sized,
            "decode_sized_shape": [rows, cfg.text.hidden_size, cfg.text.intermediate_size],
            "roofline_fraction": flops * tokens_per_s / peak,
            "roofline_fraction_vs_median_square": flops * tokens_per_s / square["median"],
        })
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
