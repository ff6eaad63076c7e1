"""`vlmgym plan`: per-device memory of one training step, from XLA's compiled programs, without the weights.

    vlmgym plan --params FILE [--params OVERLAY ...] [any flag below, which wins over the params]
    vlmgym plan --config 2b|4b|8b|qwen2.5-3b|qwen2.5-7b|tiny --mesh DATA,FSDP,TENSOR --batch B --seq T [--answer A]
                [--group G] [--micro-batches M] [--image HxW] [--remat none|layer] [--param-dtype bf16|fp32]
                [--dtype ...] [--freeze none|vision] [--lora-rank R] [--[no-]share-prefix] [--algorithm grpo|sft]
                [--no-rollout] [--accelerator] [--json PATH]

`--params` reads the shapes from a params file or a preset merged over the defaults (as `vlmgym preset FILE` writes
params.yaml; a further --params merges on top, as `vlmgym preset FILE --on-top`): the model, mesh, batch,
micro-batches, remat, freeze, LoRA and answer length from their keys, the image and the prompt's length from the
pipeline's own resize and tokenizer (params_shapes.py). It prints each shape with where it came from before
compiling.

Compiles the trainer's learner update (`grpo_gradients` or `sft_gradients`: loss + backward; `apply_update`:
the AdamW step) and the rollout engine's prefill and decode loop for abstract inputs (jax.ShapeDtypeStruct,
no weights allocated) on DATA*FSDP*TENSOR fake CPU devices, with the model's sharding rules, and prints each
program's per-device bytes (arguments, outputs, aliases, temporaries) and the step's peak as JSON (stdout)
and as a table under the shapes it planned (stderr). The fake devices need `--xla_force_host_platform_device_count`
before JAX starts: when JAX is already imported the command runs itself again in a child process.

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

import numpy as np

from vlmgym.plan.model_spec import CONFIGS, QWEN2_5, PlanSpec

DEVICE_FLAG = "--xla_force_host_platform_device_count"


def _ints(text: str, count: int, sep: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(sep))
    except ValueError:
        values = ()
    if len(values) != count or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected {count} positive integers separated by {sep!r}, got {text!r}")
    return values


# The PlanSpec fields a flag sets (argparse's dest names them alike); without --params, the defaults of those left out
FIELDS = ("config", "mesh", "batch", "seq", "answer", "group", "micro_batches", "share_prefix", "image", "remat",
          "param_dtype", "dtype", "freeze", "lora_rank", "algorithm")
FLAG_DEFAULTS = {"mesh": (1, 1, 1), "answer": 64, "group": 8, "micro_batches": 1, "share_prefix": True,
                 "remat": "none", "freeze": "none", "lora_rank": 0, "algorithm": "grpo"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlmgym plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", action="append", metavar="FILE", default=None,
                        help="read the shapes from this params file or preset merged over the defaults, as `vlmgym "
                             "preset FILE` writes params.yaml; repeated, each further file on top (`--on-top`), e.g. "
                             "a recipe then its LoRA overlay. Any flag below wins over the params")
    parser.add_argument("--config", choices=CONFIGS, default=None,
                        help="model: a shipped Qwen3-VL (2b, 4b, 8b), Qwen2.5-VL (qwen2.5-3b, qwen2.5-7b) or the "
                             "tiny one (params: model.source)")
    parser.add_argument("--mesh", type=lambda t: _ints(t, 3, ","), default=None,
                        help="data,fsdp,tensor device counts (train.mesh; sft.mesh); without --params 1,1,1")
    parser.add_argument("--batch", type=int, default=None,
                        help="completions per step: train.batch_prompts x group_size (sft: batch_size)")
    parser.add_argument("--seq", type=int, default=None,
                        help="prompt tokens, image included (padded up to the engine's length bucket)")
    parser.add_argument("--answer", type=int, default=None,
                        help="completion tokens: train.max_new_tokens (sft: max_target_tokens); without --params 64")
    parser.add_argument("--group", type=int, default=None,
                        help="completions per prompt: train.group_size (sft: 1); without --params 8")
    parser.add_argument("--micro-batches", type=int, default=None,
                        help="train.micro_batches (sft.micro_batches); without --params 1")
    parser.add_argument("--share-prefix", action=argparse.BooleanOptionalAction, default=None,
                        help="train.share_prefix: the learner runs each prompt once per group (default) or once per "
                             "completion")
    parser.add_argument("--image", type=lambda t: _ints(t, 2, "x"), default=None,
                        help="HxW of each prompt's image after resizing (multiples of 32); without --params 512x672 "
                             "(336 tokens: the OSV-5M recipe's), 96x128 for tiny (12 tokens)")
    parser.add_argument("--remat", choices=("none", "layer"), default=None, help="train.remat / sft.remat")
    parser.add_argument("--param-dtype", choices=("bf16", "fp32"), default=None,
                        help="model.param_dtype (without --params bf16, fp32 for tiny)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                        help="model.dtype, the compute dtype (default: the param dtype)")
    parser.add_argument("--freeze", choices=("none", "vision"), default=None, help="train.freeze / sft.freeze")
    parser.add_argument("--lora-rank", type=int, default=None,
                        help="train.lora.rank: LoRA adapters on the decoder projections, only they trained (0: off)")
    parser.add_argument("--algorithm", choices=("grpo", "sft"), default=None,
                        help="the update compiled (rloo runs grpo's; sft has no rollout); params: train.algorithm")
    parser.add_argument("--no-rollout", action="store_true", help="leave out the rollout programs")
    parser.add_argument("--accelerator", action="store_true",
                        help="compile for the accelerators JAX sees (as many as the mesh has) instead of fake CPU "
                             "devices: that backend's own buffer assignment (XLA:CPU's overstates a GPU's)")
    parser.add_argument("--json", default=None, help="also write the JSON report to this file")
    return parser


def parse_args(argv: list[str]) -> tuple[PlanSpec, argparse.Namespace]:
    """The PlanSpec of the command line; `args.shapes_from` says where each field came from, `args.notes` what the
    plan leaves out of the params' step."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return resolve(parser, args), args


def resolve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> PlanSpec:
    """The PlanSpec of parsed flags over the params (if any); sets args.shapes_from and args.notes. A shape
    neither gives, or one the trainer would reject, is a usage error naming the flag."""
    from vlmgym.config.spec import ParamsError

    given = {field: getattr(args, field) for field in FIELDS if getattr(args, field) is not None}
    try:
        if args.params:
            from vlmgym.plan import params_shapes

            values, sources, notes = params_shapes.derive(params_shapes.load(args.params), given)
        else:
            missing = [f"--{name}" for name in ("config", "batch", "seq") if name not in given]
            if missing:
                raise ValueError(f"{', '.join(missing)} required (or --params FILE)")
            values = {**FLAG_DEFAULTS, **given}
            tiny = values["config"] == "tiny"
            values.setdefault("param_dtype", "fp32" if tiny else "bf16")
            values.setdefault("dtype", values["param_dtype"])
            qwen2_5 = values["config"].startswith(QWEN2_5)  # 28-pixel merged patches
            values.setdefault("image", (96, 128) if tiny else (504, 672) if qwen2_5 else (512, 672))
            sources = {k: "--" + k.replace("_", "-") if k in given else "default" for k in values}
            notes = []
        spec = PlanSpec(**values)
        spec.check()
    except (ParamsError, ValueError) as err:
        parser.error(str(err))
    args.shapes_from, args.notes = sources, notes
    return spec


def mesh_devices(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Devices the plan's mesh has (the fake CPU devices to ask for before JAX starts), without importing JAX."""
    if args.mesh is not None or not args.params:
        return int(np.prod(args.mesh or FLAG_DEFAULTS["mesh"]))
    from vlmgym.config.spec import ParamsError
    from vlmgym.plan import params_shapes

    try:
        return int(np.prod(params_shapes.mesh_of(params_shapes.load(args.params), args.algorithm)))
    except (ParamsError, ValueError) as err:
        parser.error(str(err))


def describe(spec: PlanSpec, sources: dict[str, str], notes: list[str], params: list[str] | None) -> str:
    """Each planned shape with where it came from (the lines printed before compiling)."""
    head = (f"shapes from {' + '.join(params)} over the defaults (a flag wins over the params):" if params
            else "shapes from the flags:")
    unplanned = ({"tiny"} if spec.config != "tiny" else set()) | (
        {"lora_targets", "lora_vision"} if not spec.lora_rank else set())  # a model or adapters not planned
    rows = []
    for field in ("config", *FIELDS[1:], "tiny", "lora_targets", "lora_vision"):
        if field in sources and field not in unplanned:
            value = getattr(spec, field)
            text = ("x".join(map(str, value)) if field in ("image", "mesh") else
                    ",".join(map(str, value)) if isinstance(value, tuple) else str(value))
            rows.append((field, text, sources[field]))
    width = max(len(text) for _, text, _ in rows) + 2
    lines = [head, *(f"  {field:<15}{text:<{width}}{source}" for field, text, source in rows)]
    lines += [f"  note: {note}" for note in notes]
    return "\n".join(lines)


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
    lines = [shapes_line(report["spec"])] if "spec" in report else []
    lines.append(f"{unit + ' per device':<16}" + "".join(f"{name:>15}" for name in columns))
    for name, m in report["programs"].items():
        lines.append(f"{name:<16}" + "".join(f"{size(m[k]):>15}" for k in columns))
    lines.append("state: " + ", ".join(f"{k} {size(v)}" for k, v in report["state"].items()))
    lines.append("step peak estimate: " + ", ".join(f"{k} {size(v)}" for k, v in report["peak"].items()))
    return "\n".join(lines)


def shapes_line(spec: dict[str, Any]) -> str:
    """The shapes a report planned, in one line above its table."""
    prompts = spec["batch"] // spec["group"]
    lora = (f"LoRA rank {spec['lora_rank']} on {','.join(spec['lora_targets'])}"
            + (" and the vision tower" if spec["lora_vision"] else "") if spec["lora_rank"] else "no LoRA")
    learner = ("one prompt copy per completion" if spec["group"] > 1 and not spec["share_prefix"] else
               "each prompt once per group" if spec["group"] > 1 else "one answer per prompt")
    return (f"{spec['algorithm']} step of {spec['config']} ({spec['param_dtype']} params, {spec['dtype']} compute) on "
            f"mesh {'x'.join(map(str, spec['mesh']))}: {spec['batch']} completions ({prompts} prompts x "
            f"{spec['group']}) in {spec['micro_batches']} micro-batches, {learner}; prompt {spec['seq']} tokens "
            f"(bucket {spec['prompt_bucket']}) with a {spec['image'][0]}x{spec['image'][1]} image "
            f"({spec['image_tokens']} tokens), answer {spec['answer']} tokens; remat {spec['remat']}, freeze "
            f"{spec['freeze']}, {lora}")


def run(spec: PlanSpec, rollout: bool = True, planner: Any = None) -> dict[str, Any]:
    """The plan of `spec` in this process (JAX must see spec.devices devices); `planner`: a
    `programs.Planner` of spec to use (its static arguments then serve the caller's own calls)."""
    import time

    import jax

    from vlmgym.plan.programs import Planner, plan
    from vlmgym.plan.shapes import image_tokens, spec_config
    from vlmgym.rollout.engine import Buckets

    if jax.device_count() != spec.devices:
        raise RuntimeError(f"mesh {spec.mesh} needs {spec.devices} devices, JAX sees {jax.device_count()}")
    cfg = spec_config(spec)
    started = time.perf_counter()
    report = plan(planner or Planner(cfg, spec), rollout=rollout)
    buckets = Buckets()
    return {"spec": {**asdict(spec), "image_tokens": image_tokens(cfg, spec.image),
                     "prompt_bucket": buckets.fit(buckets.prompt_lengths, spec.seq, "prompt length")},
            "device": f"{jax.device_count()} x {jax.devices()[0].device_kind} (jax {jax.__version__})",
            "compile_s": round(time.perf_counter() - started, 1), **report}


def main(argv: list[str]) -> int:
    """Entry point of `vlmgym plan`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.accelerator:  # fake CPU devices, as many as the mesh has
        # the mesh alone (no JAX import) before the shapes: deriving them from params loads JAX modules
        devices = mesh_devices(parser, args)
        if "jax" in sys.modules:  # too late for the device-count flag: run in a fresh interpreter
            env = {**os.environ, "XLA_FLAGS": with_device_count(os.environ.get("XLA_FLAGS", ""), devices),
                   "JAX_PLATFORMS": "cpu"}
            return subprocess.run([sys.executable, "-m", "vlmgym.plan.cli", *argv], env=env).returncode
        os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), devices)
        os.environ["JAX_PLATFORMS"] = "cpu"
    spec = resolve(parser, args)
    print(describe(spec, args.shapes_from, args.notes, args.params), file=sys.stderr, flush=True)
    report = run(spec, rollout=not args.no_rollout)
    report["shapes_from"], report["notes"] = args.shapes_from, args.notes
    print(table(report), file=sys.stderr)
    text = json.dumps(report, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
