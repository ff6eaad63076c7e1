"""Helpers for the Qwen3-VL model tests: tiny random HF models, batches, transformers reference runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 250, 251, 252, 253
VOCAB = 256


def tiny_hf_config(tie: bool, deepstack: tuple[int, ...]) -> Any:
    """A tiny Qwen3-VL config that keeps every architectural feature (GQA, MRoPE sections, DeepStack)."""
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(
        text_config={"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
                     "max_position_embeddings": 4096, "tie_word_embeddings": tie,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [6, 5, 5],
                                         "mrope_interleaved": True}},
        vision_config={"depth": 4, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64,
                       "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
                       "num_position_embeddings": 64, "deepstack_visual_indexes": list(deepstack)},
        tie_word_embeddings=tie, image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
    )


def build_hf_model(tie: bool, deepstack: tuple[int, ...], seed: int) -> Any:
    """A tiny HF model with every parameter (norm weights included) randomly perturbed, so swaps show."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(tiny_hf_config(tie, deepstack)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.1 if ("norm" in name or name.endswith("bias")) else 0.05
            param.add_(scale * torch.randn_like(param))
    return model


@dataclass
class Tiny:
    """An HF model, its saved folder, and the converted JAX (cfg, params)."""

    hf: Any
    hf_dir: Path
    jax_dir: Path
    cfg: Any
    params: Any


def make_tiny(tmp_root: Path, name: str, tie: bool, deepstack: tuple[int, ...], seed: int) -> Tiny:
    from vlmgym.models.checkpoint import convert_hf_to_jax, load_checkpoint

    model = build_hf_model(tie, deepstack, seed)
    hf_dir = tmp_root / name / "hf"
    model.save_pretrained(hf_dir)
    jax_dir = tmp_root / name / "jax"
    convert_hf_to_jax(hf_dir, jax_dir)
    cfg, params = load_checkpoint(jax_dir)
    return Tiny(model, hf_dir, jax_dir, cfg, params)


def image_prompt(rng: np.random.Generator, grids: list[tuple[int, int, int]], text_before: int = 3,
                 text_after: int = 4) -> list[int]:
    """Token ids: text, then for each image <vision_start> pads <vision_end> text."""
    ids = list(rng.integers(0, 200, text_before))
    for t, h, w in grids:
        ids += [VISION_START] + [IMAGE_TOKEN] * (t * h * w // 4) + [VISION_END]
        ids += list(rng.integers(0, 200, text_after))
    return [int(i) for i in ids]


def make_batch(rows: list[list[int]], grids: list[tuple[int, int, int]], seed: int = 0,
               pad_left: bool = True, patch: int = 16) -> dict[str, np.ndarray]:
    """A padded numpy batch; `grids` lists every image of the batch in order (rows first); random pixel rows of
    `patch`-pixel patches (16: Qwen3-VL, 14: Qwen2.5-VL)."""
    length = max(len(r) for r in rows)
    input_ids = np.zeros((len(rows), length), np.int64)
    mask = np.zeros((len(rows), length), np.int64)
    for i, row in enumerate(rows):
        start = length - len(row) if pad_left else 0
        input_ids[i, start:start + len(row)] = row
        mask[i, start:start + len(row)] = 1
    n_patches = sum(t * h * w for t, h, w in grids)
    pixel_values = np.random.default_rng(seed).standard_normal((n_patches, 3 * 2 * patch * patch)).astype(np.float32)
    return {"input_ids": input_ids, "attention_mask": mask, "pixel_values": pixel_values if grids else None,
            "grid_thw": np.array(grids, np.int64).reshape(-1, 3)}


def hf_forward(model: Any, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """transformers logits (fp32 numpy) and its (3, B, L) MRoPE position ids for the batch."""
    import torch

    input_ids = torch.from_numpy(batch["input_ids"])
    mask = torch.from_numpy(batch["attention_mask"])
    mm_types = (input_ids == IMAGE_TOKEN).int()
    kwargs: dict[str, Any] = {}
    grid = torch.from_numpy(batch["grid_thw"]) if batch["pixel_values"] is not None else None
    if grid is not None:
        kwargs = {"pixel_values": torch.from_numpy(batch["pixel_values"]), "image_grid_thw": grid,
                  "mm_token_type_ids": mm_types}
    with torch.no_grad():
        position_ids = torch.from_numpy(hf_positions(model, batch))
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, **kwargs)
    return out.logits.float().numpy(), position_ids.numpy()


def hf_positions(model: Any, batch: dict[str, np.ndarray]) -> np.ndarray:
    """transformers' (3, B, L) MRoPE position ids (get_rope_index) for the batch."""
    import torch

    input_ids = torch.from_numpy(batch["input_ids"])
    grid = torch.from_numpy(batch["grid_thw"]) if batch["pixel_values"] is not None else None
    with torch.no_grad():
        position_ids, _ = model.model.get_rope_index(input_ids, (input_ids == IMAGE_TOKEN).int(), image_grid_thw=grid,
                                                     attention_mask=torch.from_numpy(batch["attention_mask"]))
    return position_ids.numpy()
