"""`vlmgym parity`: run transformers and the JAX port on the same inputs and compare their logits.

Both sides get the same numpy-processed inputs (vlmgym's processor, itself tested against
transformers); transformers computes its own MRoPE positions, the JAX side uses the
processor's. Prints JSON and exits 1 when the max abs logit difference exceeds the tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_TOLERANCE = {"fp32": 1e-3, "bf16": 1.0}
DEFAULT_PROMPT = "Describe this image."


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
    import torch

    kwargs = {"input_ids": torch.from_numpy(inputs["input_ids"].astype(np.int64)),
              "attention_mask": torch.from_numpy(inputs["attention_mask"].astype(np.int64))}
    if inputs["image_grid_thw"].shape[0]:
        kwargs.update(pixel_values=torch.from_numpy(inputs["pixel_values"]).to(model.dtype),
                      image_grid_thw=torch.from_numpy(inputs["image_grid_thw"].astype(np.int64)),
                      mm_token_type_ids=torch.from_numpy(inputs["mm_token_type_ids"].astype(np.int64)))
    with torch.no_grad():
        model.model.rope_deltas = None
        logits = model(**kwargs).logits.float().numpy()
        generated: list[int] = []
        if max_new_tokens:
            model.model.rope_deltas = None
            out = model.generate(**kwargs, max_new_tokens=max_new_tokens, do_sample=False, top_k=None, top_p=None,
                                 temperature=None)
            generated = out[0, inputs["input_ids"].shape[1]:].tolist()
    return logits, generated


def _jax_side(cfg: Any, params: Any, inputs: dict[str, np.ndarray],
              max_new_tokens: int) -> tuple[np.ndarray, list[int]]:
    """JAX logits and greedy continuation (prefill + decode steps)."""
    from vlmgym.models.qwen3_vl import model as qwen
    from vlmgym.models.qwen3_vl.vision import encode_images

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
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from vlmgym.models.qwen3_vl.convert import load_checkpoint
    from vlmgym.models.qwen3_vl.processor import Processor

    if dtype not in DEFAULT_TOLERANCE:
        raise ValueError(f"dtype must be one of {list(DEFAULT_TOLERANCE)}, got {dtype!r}")
    tolerance = DEFAULT_TOLERANCE[dtype] if tolerance is None else tolerance
    processor = Processor.from_pretrained(hf_dir)
    torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    hf_model = Qwen3VLForConditionalGeneration.from_pretrained(str(hf_dir), dtype=torch_dtype,
                                                               local_files_only=True).eval()
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
