"""The HF baseline: transformers runs the exported weights on the test prompts the JAX engine answered.

Three figures, all on the same prompts and images the rollout stage used:
- greedy agreement: transformers' greedy `generate` (batched, left-padded like the engine) against the JAX
  engine's greedy answers from the rollout JSONL, token by token through the first end-of-turn token.
  `greedy_token_agreement` = matching positions / positions of the longer answer, over all compared samples;
  `greedy_exact_match` = share of samples whose answers are identical.
- max logit difference: one forward of each implementation over prompt + the JAX answer of a few samples
  (transformers on the exported folder, JAX on the folder it was exported from), max |difference| over every
  position and vocabulary entry.
- tokens/s: generated tokens per second of transformers' generate here; the JAX engine's figure comes from the
  rollout stage (first batch, which compiles, left out), at the same batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.models.qwen3_vl.hf_reference import (
    answer_through_eos,
    hf_greedy,
    hf_logits,
    load_hf_model,
    torch_inputs,
)


def token_agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> dict[str, float]:
    """Position-wise agreement of two lists of answers (matches / positions of the longer) and exact matches."""
    if len(reference) != len(other):
        raise ValueError(f"token agreement needs as many answers on both sides, got {len(reference)} and {len(other)}")
    if not reference:
        raise ValueError("token agreement of zero answers")
    matches = positions = exact = 0
    first_divergence = []
    for a, b in zip(reference, other):
        a, b = list(a), list(b)
        same = sum(x == y for x, y in zip(a, b))
        matches += same
        positions += max(len(a), len(b))
        exact += a == b
        if a != b:
            first_divergence.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
    return {"greedy_token_agreement": matches / max(positions, 1), "greedy_exact_match": exact / len(reference),
            "greedy_compared_samples": float(len(reference)), "greedy_compared_tokens": float(positions),
            "greedy_first_divergence": float(min(first_divergence)) if first_divergence else -1.0}


def max_logit_difference(model: Any, cfg: Any, params: Any, processor: Any, observation: dict,
                         answer: Sequence[int]) -> float:
    """Max |logit difference| of transformers and JAX over one prompt + answer (every position, every entry)."""
    import jax
    import jax.numpy as jnp

    from vlmgym.models.family import encode_images
    from vlmgym.models.qwen3_vl import model as qwen
    from vlmgym.models.qwen3_vl.processor import get_rope_index

    prompt = processor([observation["messages"]], [list(observation.get("images") or [])])
    ids = np.concatenate([prompt["input_ids"], np.asarray([list(answer)], np.int32)], axis=1).astype(np.int32)
    mask = np.ones_like(ids)
    grids = np.asarray(prompt["image_grid_thw"])
    position_ids, _ = get_rope_index(ids, grids if len(grids) else None, mask, image_token_id=processor.image_token_id,
                                     spatial_merge_size=processor.settings.merge_size)
    full = {**prompt, "input_ids": ids, "attention_mask": mask,
            "mm_token_type_ids": (ids == processor.image_token_id).astype(np.int32)}
    reference = hf_logits(model, torch_inputs(model, full))
    # fp32 comparison means fp32 matmuls on the JAX side too (no TF32 / bf16 passes on accelerators).
    with jax.default_matmul_precision("highest"):
        image_embeds = deepstack = None
        if len(grids):
            image_embeds, deepstack = encode_images(params, cfg, jnp.asarray(prompt["pixel_values"]), grids.tolist())
        jax_logits = np.asarray(qwen.jit_forward(params, cfg, jnp.asarray(ids), jnp.asarray(mask),
                                                 jnp.asarray(position_ids.astype(np.int32)), image_embeds, deepstack))
    return float(np.abs(reference - jax_logits).max())


def run_hf_baseline(hf_dir: str | Path, jax_dir: str | Path, observations: Sequence[dict],
                    jax_answers: Sequence[Sequence[int]], *, max_new_tokens: int, batch_size: int,
                    logit_samples: int, dtype: str = "fp32") -> tuple[dict[str, float], dict[str, float]]:
    """All HF-baseline figures for these observations and the JAX engine's greedy answers to them, and the timing
    of transformers' generate (`hf_seconds`, `hf_tokens_per_s`: different on every run, so kept apart)."""
    from vlmgym.models.checkpoint import load_checkpoint
    from vlmgym.models.qwen3_vl.processor import Processor

    if len(observations) != len(jax_answers):
        raise ValueError(f"{len(observations)} observations but {len(jax_answers)} JAX answers")
    processor = Processor.from_pretrained(hf_dir)
    model = load_hf_model(hf_dir, dtype)
    hf_answers, hf_tokens, hf_seconds = hf_greedy(model, processor, observations, max_new_tokens=max_new_tokens,
                                                  batch_size=batch_size)
    eos_ids = list(processor.eos_token_ids)
    jax_answers = [answer_through_eos(a, eos_ids) for a in jax_answers]
    figures = token_agreement(jax_answers, hf_answers)
    figures["hf_generated_tokens"] = float(hf_tokens)
    timing = {"hf_seconds": hf_seconds, "hf_tokens_per_s": hf_tokens / max(hf_seconds, 1e-9)}
    if logit_samples > 0:
        cfg, params = load_checkpoint(jax_dir, dtype=dtype, param_dtype=dtype)
        diffs = [max_logit_difference(model, cfg, params, processor, obs, answer)
                 for obs, answer in list(zip(observations, jax_answers))[:logit_samples]]
        figures["max_abs_logit_diff"] = max(diffs)
        figures["logit_samples"] = float(len(diffs))
    return figures, timing
