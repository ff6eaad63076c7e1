"""Helpers for the Qwen2.5-VL model tests: tiny random HF Qwen2.5-VL models (offline), converted to JAX."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import qwen_fixtures

# the same token ids and prompts (merged patches are 2x2 in both families)
from qwen_fixtures import IMAGE_TOKEN, VIDEO_TOKEN, VISION_END, VISION_START, VOCAB, image_prompt  # noqa: F401

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


def make_batch(rows: list[list[int]], grids: list[tuple[int, int, int]], seed: int = 0,
               pad_left: bool = True) -> dict[str, np.ndarray]:
    """qwen_fixtures.make_batch with Qwen2.5-VL's 14-pixel patches."""
    return qwen_fixtures.make_batch(rows, grids, seed, pad_left, patch=PATCH)


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


def rope_index(cfg: Any, input_ids: Any, image_grid_thw: Any, attention_mask: Any = None) -> tuple[Any, Any]:
    """MRoPE position ids (3, B, L) and rope deltas (B, 1), as `Qwen2_5_VLModel.get_rope_index` (still images)."""
    from vlmgym.models.qwen3_vl.processor import get_rope_index

    return get_rope_index(input_ids, image_grid_thw, attention_mask, image_token_id=cfg.image_token_id,
                          spatial_merge_size=cfg.vision.spatial_merge_size)


def jit_forward(params: Any, cfg: Any, input_ids: Any, attention_mask: Any, position_ids: Any = None,
                image_embeds: Any = None) -> Any:
    """The shared decoder's full forward (float32 logits (B, L, V)) on a Qwen2.5-VL: no DeepStack embeds."""
    from vlmgym.models.qwen3_vl import model as decoder

    return decoder.jit_forward(params, cfg, input_ids, attention_mask, position_ids, image_embeds, None)
