"""convert stage: HF checkpoint (models/hf/base/) -> JAX checkpoint (models/jax/base/), then a parity check.

Converts the safetensors into an orbax checkpoint with config.json and the tokenizer /
preprocessor files, then runs transformers and the JAX port on a text-only prompt and a
one-image prompt and logs the logit differences to MLflow. Beyond `model.parity_tolerance`
the stage fails and removes its output.

    python stages/convert.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from vlmgym import tracking
from vlmgym.models.qwen3_vl.convert import convert_hf_to_jax
from vlmgym.models.qwen3_vl.params import abstract_params, count_params
from vlmgym.models.qwen3_vl.parity import run_parity
from vlmgym.params import ModelParams, load_section

PROMPT = "Where was this photo taken? Answer with the country."


class ParityFailure(RuntimeError):
    """The converted checkpoint does not reproduce transformers' logits within tolerance."""


def parity_image(seed: int = 0, size: tuple[int, int] = (256, 192)) -> Image.Image:
    """A deterministic synthetic RGB image (smooth gradient plus noise) so parity needs no dataset."""
    width, height = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1) * 200
    pixels = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def main(argv: list[str] | None = None) -> int:
    """Convert, check parity, log one MLflow run; exit 1 (and remove the output) beyond tolerance."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (section `model`)")
    args = parser.parse_args(argv)
    params = load_section("model", args.params)
    try:
        report, metrics = convert_and_check(params, args.params)
    except ParityFailure as err:
        print(f"convert: parity FAILED: {err}", file=sys.stderr)
        return 1
    print(f"convert: {params.hf_dir} -> {params.jax_dir} ({metrics['params_total']} parameters, "
          f"max abs logit diff {report['max_abs_logit_diff']:.3g}, {params.dtype})")
    return 0


def convert_and_check(params: ModelParams, params_file: str = "params.yaml") -> tuple[dict, dict]:
    """The stage body inside one MLflow run (marked failed when parity fails)."""
    with tracking.stage_run("convert", params, params_file=params_file) as run:
        cfg, out_dir = convert_hf_to_jax(params.hf_dir, params.jax_dir)
        cases = [(PROMPT, []), (PROMPT, [parity_image()])]
        report = run_parity(params.hf_dir, out_dir, cases, dtype=params.dtype, tolerance=params.parity_tolerance)
        metrics = {
            "params_total": count_params(abstract_params(cfg)),
            "max_abs_logit_diff": report["max_abs_logit_diff"],
            "mean_abs_logit_diff": report["mean_abs_logit_diff"],
            "greedy_token_agreement": report["greedy_token_agreement"],
            "parity_passed": float(report["passed"]),
        }
        for name, case in zip(("text", "image"), report["cases"]):
            metrics[f"{name}.max_abs_logit_diff"] = case["max_abs_logit_diff"]
            if case["greedy_generation_agreement"] is not None:
                metrics[f"{name}.greedy_generation_agreement"] = case["greedy_generation_agreement"]
        run.log_metrics(metrics)
        run.log_dict(report, "parity.json")
        if not report["passed"]:
            shutil.rmtree(Path(out_dir), ignore_errors=True)
            raise ParityFailure(f"max abs logit diff {report['max_abs_logit_diff']:.3g} > {params.parity_tolerance} "
                                f"({params.dtype}); removed {out_dir}")
    return report, metrics


if __name__ == "__main__":
    sys.exit(main())
