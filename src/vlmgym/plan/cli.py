"""`vlmgym plan`: per-device memory of one training step, from XLA's compiled programs, without the weights.

    vlmgym plan --config 2b|4b|8b|tiny --mesh DATA,FSDP,TENSOR --batch B --seq T [--answer A] [--group G]
                [--micro-batches M] [--image HxW] [--remat none|layer] [--param-dtype bf16|fp32] [--dtype ...]
                [--freeze none|vision] [--algorithm grpo|sft] [--no-rollout] [--accelerator] [--json PATH]

Compiles the trainer's learner update (`grpo_gradients` or `sft_gradients`: loss + backward; `apply_update`:
the AdamW step) and the rollout engine's prefill and decode loop for abstract inputs (jax.ShapeDtypeStruct,
no weights allocated) on DATA*FSDP*TENSOR fake CPU devices, with the model's sharding rules, and prints each
program's per-device bytes (arguments, outputs, aliases, temporaries) and the step's peak as JSON (stdout)
and as a table (stderr). The fake devices need `--xla_force_host_platform_device_count` before JAX starts:
when JAX is already imported the command runs itself again in a child process.

These are XLA:CPU's figures unless `--accelerator` compiles for the GPUs JAX sees: XLA:CPU's buffer assignment
overstates a GPU's temporaries, so on a CPU treat them as upper bounds (BENCHMARKS.md, "Memory plan", compares
both with live buffers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from typing import Any

from vlmgym.plan.model_spec import CONFIGS, PlanSpec

DEVICE_FLAG = "--xla_force_host_platform_device_count"


def _ints(text: str, count: int, sep: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(sep))
    except ValueError:
        values = ()
    if len(values) != count or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected {count} positive integers separated by {sep!r}, got {text!r}")
    return values


def parse_args(argv: list[str]) -> tuple[PlanSpec, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="vlmgym plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=CONFIGS, required=True, help="model: a shipped Qwen3-VL or the tiny one")
    parser.add_argument("--mesh", type=lambda t: _ints(t, 3, ","), default=(1, 1, 1),
                        help="data,fsdp,tensor device counts (train.mesh)")
    parser.add_argument("--batch", type=int, required=True,
                        help="completions per step: train.batch_prompts x group_size (sft: batch_size)")
    parser.add_argument("--seq", type=int, required=True,
                        help="prompt tokens, image included (padded up to the engine's length bucket)")
    parser.add_argument("--answer", type=int, default=64,
                        help="completion tokens: train.max_new_tokens (sft: max_target_tokens)")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt: train.group_size (sft: 1)")
    parser.add_argument("--micro-batches", type=int, default=1, help="train.micro_batches")
    parser.add_argument("--image", type=lambda t: _ints(t, 2, "x"), default=None,
                        help="HxW of each prompt's image after resizing (multiples of 32); default 512x672 "
                             "(336 tokens: the OSV-5M recipe's), 96x128 for tiny (12 tokens)")
    parser.add_argument("--remat", choices=("none", "layer"), default="none", help="train.remat / sft.remat")
    parser.add_argument("--param-dtype", choices=("bf16", "fp32"), default=None,
                        help="model.param_dtype (default bf16, fp32 for tiny)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                        help="model.dtype, the compute dtype (default: the param dtype)")
    parser.add_argument("--freeze", choices=("none", "vision"), default="none", help="train.freeze")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="train.lora.rank: LoRA adapters on the decoder projections, only they trained (0: off)")
    parser.add_argument("--algorithm", choices=("grpo", "sft"), default="grpo",
                        help="the update compiled (rloo runs grpo's; sft has no rollout)")
    parser.add_argument("--no-rollout", action="store_true", help="leave out the rollout programs")
    parser.add_argument("--accelerator", action="store_true",
                        help="compile for the accelerators JAX sees (as many as the mesh has) instead of fake CPU "
                             "devices: that backend's own buffer assignment (XLA:CPU's overstates a GPU's)")
    parser.add_argument("--json", default=None, help="also write the JSON report to this file")
    args = parser.parse_args(argv)
    tiny = args.config == "tiny"
    param_dtype = args.param_dtype or ("fp32" if tiny else "bf16")
    spec = PlanSpec(config=args.config, mesh=args.mesh, batch=args.batch, seq=args.seq, answer=args.answer,
                    group=args.group, micro_batches=args.micro_batches,
                    image=args.image or ((96, 128) if tiny else (512, 672)), remat=args.remat,
                    algorithm=args.algorithm, freeze=args.freeze, lora_rank=args.lora_rank,
                    dtype=args.dtype or param_dtype, param_dtype=param_dtype)
    try:
        spec.check()
    except ValueError as err:
        parser.error(str(err))
    return spec, args


def with_device_count(flags: str, count: int) -> str:
    """XLA_FLAGS `flags` with their fake host device count (if any) replaced by `count`."""
    flags = re.sub(rf"{DEVICE_FLAG}=\d+", "", flags).strip()
    return f"{flags} {DEVICE_FLAG}={count}".strip()


def table(report: dict[str, Any]) -> str:
    """The report's programs and peaks as a fixed-width table per device (GiB, or MiB for small models)."""
    gib = report["peak"]["step"] >= 2**30
    unit, scale = ("GiB", 2**30) if gib else ("MiB", 2**20)

    def size(n: int) -> str:
        return f"{n / scale:.2f}"

    columns = ("arguments", "live_arguments", "outputs", "aliases", "temporaries", "peak")
    lines = [f"{unit + ' per device':<16}" + "".join(f"{name:>15}" for name in columns)]
    for name, m in report["programs"].items():
        lines.append(f"{name:<16}" + "".join(f"{size(m[k]):>15}" for k in columns))
    lines.append("state: " + ", ".join(f"{k} {size(v)}" for k, v in report["state"].items()))
    lines.append("step peak estimate: " + ", ".join(f"{k} {size(v)}" for k, v in report["peak"].items()))
    return "\n".join(lines)


def run(spec: PlanSpec, rollout: bool = True, planner: Any = None) -> dict[str, Any]:
    """The plan of `spec` in this process (JAX must see spec.devices devices); `planner`: a
    `programs.Planner` of spec to use (its static arguments then serve the caller's own calls)."""
    import time

    import jax

    from vlmgym.plan.programs import Planner, plan
    from vlmgym.plan.shapes import image_tokens, plan_config

    if jax.device_count() != spec.devices:
        raise RuntimeError(f"mesh {spec.mesh} needs {spec.devices} devices, JAX sees {jax.device_count()}")
    cfg = plan_config(spec.config, spec.dtype, spec.param_dtype)
    started = time.perf_counter()
    report = plan(planner or Planner(cfg, spec), rollout=rollout)
    return {"spec": {**asdict(spec), "image_tokens": image_tokens(cfg, spec.image)},
            "device": f"{jax.device_count()} x {jax.devices()[0].device_kind} (jax {jax.__version__})",
            "compile_s": round(time.perf_counter() - started, 1), **report}


def main(argv: list[str]) -> int:
    """Entry point of `vlmgym plan`."""
    spec, args = parse_args(argv)
    if not args.accelerator:  # fake CPU devices, as many as the mesh has
        if "jax" in sys.modules:  # too late for the device-count flag: run in a fresh interpreter
            env = {**os.environ, "XLA_FLAGS": with_device_count(os.environ.get("XLA_FLAGS", ""), spec.devices),
                   "JAX_PLATFORMS": "cpu"}
            return subprocess.run([sys.executable, "-m", "vlmgym.plan.cli", *argv], env=env).returncode
        os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), spec.devices)
        os.environ["JAX_PLATFORMS"] = "cpu"
    report = run(spec, rollout=not args.no_rollout)
    print(table(report), file=sys.stderr)
    text = json.dumps(report, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
