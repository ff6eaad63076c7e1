"""`vlmgym parity`: run transformers and the JAX port on the same inputs and compare their logits (either model
family: the folders' config.json says which).

Both sides get the same numpy-processed inputs (vlmgym's processor, itself tested against
transformers); transformers computes its own MRoPE positions, the JAX side uses the
processor's. Prints JSON and exits 1 when the max abs logit difference exceeds the tolerance.
`convert_and_check` is the convert stage's work: convert, then the same comparison on a
text-only and a one-image prompt that need no dataset.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

DEFAULT_TOLERANCE = {"fp32": 1e-3, "bf16": 1.0}
DEFAULT_PROMPT = "Describe this image."
CONVERT_PROMPT = "Where was this photo taken? Answer with the country."


class ParityFailure(RuntimeError):
    """The converted checkpoint does not reproduce transformers' logits within tolerance."""


def _messages(prompt: str, n_images: int) -> list[dict[str, Any]]:
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": prompt}]
    return [{"role": "user", "content": content}]


def _load_images(paths: Sequence[str | Path]) -> list[Any]:
    from PIL import Image

    images = []
    for path in paths:
        try:
            with Image.open(path) as image:
                images.append(image.convert("RGB"))
        except OSError as err:
            raise ValueError(f"{path}: cannot read image ({err})") from err
    return images


def _hf_side(model: Any, inputs: dict[str, np.ndarray], max_new_tokens: int) -> tuple[np.ndarray, list[int]]:
    """transformers logits (float32 numpy) and its greedy continuation."""
    from vlmgym.models.qwen3_vl.hf_reference import GREEDY, hf_generate, hf_logits, torch_inputs

    kwargs = torch_inputs(model, inputs)
    logits = hf_logits(model, kwargs)
    generated: list[int] = []
    if max_new_tokens:
        out = hf_generate(model, kwargs, max_new_tokens=max_new_tokens, **GREEDY)
        generated = out[0, inputs["input_ids"].shape[1]:].tolist()
    return logits, generated


def _jax_side(cfg: Any, params: Any, inputs: dict[str, np.ndarray],
              max_new_tokens: int) -> tuple[np.ndarray, list[int]]:
    """JAX logits and greedy continuation (prefill + decode steps)."""
    from vlmgym.models.family import encode_images
    from vlmgym.models.qwen3_vl import model as qwen

    image_embeds = deepstack = None
    if inputs["image_grid_thw"].shape[0]:
        image_embeds, deepstack = encode_images(params, cfg, jnp.asarray(inputs["pixel_values"]),
                                                inputs["image_grid_thw"].tolist())
    args = (jnp.asarray(inputs["input_ids"]), jnp.asarray(inputs["attention_mask"]),
            jnp.asarray(inputs["position_ids"]), image_embeds, deepstack)
    logits = np.asarray(qwen.jit_forward(params, cfg, *args))
    generated: list[int] = []
    if max_new_tokens:
        step_logits, cache = qwen.jit_prefill(params, cfg, *args, cache_size=args[0].shape[1] + max_new_tokens)
        for _ in range(max_new_tokens):
            token = jnp.argmax(step_logits, axis=-1).astype(jnp.int32)
            generated.append(int(token[0]))
            step_logits, cache = qwen.jit_decode_step(params, cfg, token, cache)
    return logits, generated


def run_parity(hf_dir: str | Path, jax_dir: str | Path, cases: Sequence[tuple[str, Sequence[Any]]],
               dtype: str = "fp32", tolerance: float | None = None, max_new_tokens: int = 8) -> dict[str, Any]:
    """Compare the two implementations on each (prompt, images) case; returns per-case and overall figures."""
    from vlmgym.models.checkpoint import load_checkpoint
    from vlmgym.models.qwen3_vl.hf_reference import load_hf_model
    from vlmgym.models.qwen3_vl.processor import Processor

    if dtype not in DEFAULT_TOLERANCE:
        raise ValueError(f"dtype must be one of {list(DEFAULT_TOLERANCE)}, got {dtype!r}")
    tolerance = DEFAULT_TOLERANCE[dtype] if tolerance is None else tolerance
    processor = Processor.from_pretrained(hf_dir)
    hf_model = load_hf_model(hf_dir, dtype)
    cfg, params = load_checkpoint(jax_dir, dtype=dtype, param_dtype=dtype)
    results = []
    # fp32 parity means fp32 matmuls: keep XLA from using TF32 / bf16 passes on accelerators.
    with jax.default_matmul_precision("highest" if dtype == "fp32" else "default"):
        for prompt, images in cases:
            inputs = processor([_messages(prompt, len(images))], [list(images)])
            hf_logits, hf_tokens = _hf_side(hf_model, inputs, max_new_tokens)
            jax_logits, jax_tokens = _jax_side(cfg, params, inputs, max_new_tokens)
            valid = inputs["attention_mask"].astype(bool)
            diff = np.abs(hf_logits - jax_logits)[valid]
            same_argmax = hf_logits.argmax(-1)[valid] == jax_logits.argmax(-1)[valid]
            compared = min(len(hf_tokens), len(jax_tokens))
            generation = (float(np.mean(np.array(hf_tokens[:compared]) == np.array(jax_tokens[:compared])))
                          if compared else None)
            results.append({
                "prompt": prompt, "images": len(images), "tokens": int(valid.sum()),
                "hf_logits_shape": list(hf_logits.shape), "jax_logits_shape": list(jax_logits.shape),
                "max_abs_logit_diff": float(diff.max()), "mean_abs_logit_diff": float(diff.mean()),
                "greedy_token_agreement": float(same_argmax.mean()),
                "greedy_generation_agreement": generation, "hf_generated": hf_tokens, "jax_generated": jax_tokens,
            })
    worst = max(r["max_abs_logit_diff"] for r in results)
    return {
        "dtype": dtype, "tolerance": tolerance, "passed": bool(worst <= tolerance),
        "max_abs_logit_diff": worst,
        "mean_abs_logit_diff": float(np.mean([r["mean_abs_logit_diff"] for r in results])),
        "greedy_token_agreement": float(np.mean([r["greedy_token_agreement"] for r in results])),
        "cases": results,
    }


def parity_image(seed: int = 0, size: tuple[int, int] = (256, 192)) -> Image.Image:
    """A deterministic synthetic RGB image (smooth gradient plus noise) so parity needs no dataset."""
    width, height = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1) * 200
    pixels = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


@dataclass
class ConvertResult:
    """The convert stage's outcome: the parity report, its figures as flat metrics, the converted folder."""

    report: dict[str, Any]
    metrics: dict[str, float]
    out_dir: Path

    def raise_if_failed(self) -> None:
        """Beyond tolerance: remove the converted folder and raise ParityFailure."""
        if not self.report["passed"]:
            shutil.rmtree(self.out_dir, ignore_errors=True)
            report = self.report
            raise ParityFailure(f"max abs logit diff {report['max_abs_logit_diff']:.3g} > {report['tolerance']} "
                                f"({report['dtype']}); removed {self.out_dir}")


def convert_and_check(hf_dir: str | Path, jax_dir: str | Path, dtype: str = "fp32",
                      tolerance: float | None = None) -> ConvertResult:
    """HF folder -> JAX checkpoint, then parity on a text-only and a one-image prompt (the caller logs the figures
    and calls `raise_if_failed`)."""
    from vlmgym.models.checkpoint import convert_hf_to_jax
    from vlmgym.models.family import family_of
    from vlmgym.models.qwen3_vl.weights import count_params

    cfg, out_dir = convert_hf_to_jax(hf_dir, jax_dir)
    cases = [(CONVERT_PROMPT, []), (CONVERT_PROMPT, [parity_image()])]
    report = run_parity(hf_dir, out_dir, cases, dtype=dtype, tolerance=tolerance)
    metrics = {
        "params_total": count_params(family_of(cfg).abstract_params(cfg)),
        "max_abs_logit_diff": report["max_abs_logit_diff"],
        "mean_abs_logit_diff": report["mean_abs_logit_diff"],
        "greedy_token_agreement": report["greedy_token_agreement"],
        "parity_passed": float(report["passed"]),
    }
    for name, case in zip(("text", "image"), report["cases"]):
        metrics[f"{name}.max_abs_logit_diff"] = case["max_abs_logit_diff"]
        if case["greedy_generation_agreement"] is not None:
            metrics[f"{name}.greedy_generation_agreement"] = case["greedy_generation_agreement"]
    return ConvertResult(report, metrics, Path(out_dir))


def main(argv: list[str] | None = None) -> int:
    """CLI entry: `vlmgym parity --hf DIR --jax DIR [--image PATH ...] [--prompt TEXT] [--dtype fp32|bf16]`."""
    parser = argparse.ArgumentParser(prog="vlmgym parity", description=__doc__.splitlines()[0])
    parser.add_argument("--hf", required=True, help="transformers checkpoint folder")
    parser.add_argument("--jax", required=True, help="converted JAX checkpoint folder")
    parser.add_argument("--image", action="append", default=[], help="image file (repeat for several)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="user text after the images")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DEFAULT_TOLERANCE), help="compute dtype of both")
    parser.add_argument("--tolerance", type=float, default=None,
                        help=f"max abs logit difference accepted (default {DEFAULT_TOLERANCE})")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="greedy tokens compared (0: skip)")
    args = parser.parse_args(argv)
    for folder in (args.hf, args.jax):
        if not Path(folder).is_dir():
            print(f"vlmgym parity: {folder}: not a folder", file=sys.stderr)
            return 2
    try:
        report = run_parity(args.hf, args.jax, [(args.prompt, _load_images(args.image))], args.dtype,
                            args.tolerance, args.max_new_tokens)
    except ValueError as err:
        print(f"vlmgym parity: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
