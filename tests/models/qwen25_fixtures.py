"""Helpers for the Qwen2.5-VL model tests: tiny random HF Qwen2.5-VL models (offline), converted to JAX."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 250, 251, 252, 253
VOCAB = 256
PATCH, MERGE = 14, 2
MERGED_PIXELS = PATCH * MERGE  # one merged (2x2) patch is 28 pixels wide


def tiny_hf_config(tie: bool, fullatt: tuple[int, ...], window_merged: int) -> Any:
    """A tiny Qwen2.5-VL config (GQA, chunked MRoPE sections, window + full attention); windows of
    `window_merged` x `window_merged` merged patches."""
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config={"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
                     "max_position_embeddings": 4096, "tie_word_embeddings": tie,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 4, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64,
                       "patch_size": PATCH, "temporal_patch_size": 2, "spatial_merge_size": MERGE,
                       "window_size": window_merged * MERGED_PIXELS, "fullatt_block_indexes": list(fullatt)},
        tie_word_embeddings=tie, image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
    )


def build_hf_model(tie: bool, fullatt: tuple[int, ...], window_merged: int, seed: int) -> Any:
    """A tiny HF model with every parameter (norm weights and biases included) randomly perturbed, so swaps show."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(tiny_hf_config(tie, fullatt, window_merged)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.1 if ("norm" in name or "ln_q" in name or name.endswith("bias")) else 0.05
            param.add_(scale * torch.randn_like(param))
    return model


@dataclass
class Tiny:
    """An HF model, its saved folder, and the converted JAX (cfg, params)."""

    hf: Any
    hf_dir: Path
    cfg: Any
    params: Any


def make_tiny(root: Path, tie: bool, fullatt: tuple[int, ...], window_merged: int, seed: int) -> Tiny:
    import jax.numpy as jnp

    from vlmgym.models.qwen2_5_vl.convert import load_hf_folder

    model = build_hf_model(tie, fullatt, window_merged, seed)
    model.save_pretrained(root)
    cfg, params = load_hf_folder(root)
    return Tiny(model, root, cfg, __import__("jax").tree.map(jnp.asarray, params))


def image_prompt(rng: np.random.Generator, grids: list[tuple[int, int, int]], text_before: int = 3,
                 text_after: int = 4) -> list[int]:
    """Token ids: text, then for each image <vision_start> pads <vision_end> text."""
    ids = list(rng.integers(0, 200, text_before))
    for t, h, w in grids:
        ids += [VISION_START] + [IMAGE_TOKEN] * (t * h * w // MERGE**2) + [VISION_END]
        ids += list(rng.integers(0, 200, text_after))
    return [int(i) for i in ids]


def make_batch(rows: list[list[int]], grids: list[tuple[int, int, int]], seed: int = 0,
               pad_left: bool = True) -> dict[str, np.ndarray]:
    """A padded numpy batch; `grids` lists every image of the batch in order (rows first)."""
    length = max(len(r) for r in rows)
    input_ids = np.zeros((len(rows), length), np.int64)
    mask = np.zeros((len(rows), length), np.int64)
    for i, row in enumerate(rows):
        start = length - len(row) if pad_left else 0
        input_ids[i, start:start + len(row)] = row
        mask[i, start:start + len(row)] = 1
    n_patches = sum(t * h * w for t, h, w in grids)
    pixel_values = np.random.default_rng(seed).standard_normal((n_patches, 3 * 2 * PATCH * PATCH)).astype(np.float32)
    return {"input_ids": input_ids, "attention_mask": mask, "pixel_values": pixel_values if grids else None,
            "grid_thw": np.array(grids, np.int64).reshape(-1, 3)}


def hf_forward(model: Any, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """transformers logits (fp32 numpy, its own position ids) and its (3, B, L) get_rope_index positions."""
    import torch

    input_ids = torch.from_numpy(batch["input_ids"])
    mask = torch.from_numpy(batch["attention_mask"])
    mm_types = (input_ids == IMAGE_TOKEN).int()
    grid = torch.from_numpy(batch["grid_thw"]) if batch["pixel_values"] is not None else None
    kwargs: dict[str, Any] = {"mm_token_type_ids": mm_types}
    if grid is not None:
        kwargs.update(pixel_values=torch.from_numpy(batch["pixel_values"]), image_grid_thw=grid)
    with torch.no_grad():
        position_ids, _ = model.model.get_rope_index(input_ids, mm_types, image_grid_thw=grid, attention_mask=mask)
        model.model.rope_deltas = None
        out = model(input_ids=input_ids, attention_mask=mask, **kwargs)
    return out.logits.float().numpy(), position_ids.numpy()
