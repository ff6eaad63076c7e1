"""Qwen2.5-VL entry points: the vision tower of this package + the Qwen3-VL decoder code, which runs the Qwen2
decoder as is (q/k/v biases are read from the params, no q/k norm in them, chunked MRoPE from the config, no
DeepStack). Shapes and dtypes as in `vlmgym.models.qwen3_vl.model`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from vlmgym.models.qwen2_5_vl.config import Qwen25VLConfig
from vlmgym.models.qwen3_vl import model as decoder
from vlmgym.models.qwen3_vl.processor import get_rope_index
from vlmgym.models.qwen3_vl.weights import Params

prefill = decoder.prefill
decode_step = decoder.decode_step
text_position_ids = decoder.text_position_ids


def forward(params: Params, cfg: Qwen25VLConfig, input_ids: jax.Array, attention_mask: jax.Array,
            position_ids: jax.Array | None = None, image_embeds: jax.Array | None = None) -> jax.Array:
    """Full forward: float32 logits (B, L, V); image_embeds from `vision.encode_images` fill the image pads."""
    return decoder.forward(params, cfg, input_ids, attention_mask, position_ids, image_embeds, None)


def rope_index(cfg: Qwen25VLConfig, input_ids: Any, image_grid_thw: Any,
               attention_mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """MRoPE position ids (3, B, L) and rope deltas (B, 1) for images, as `Qwen2_5_VLModel.get_rope_index`
    (still images: t = start, h = start + row, w = start + col; the next text resumes at start + max(h', w'))."""
    return get_rope_index(input_ids, image_grid_thw, attention_mask, image_token_id=cfg.image_token_id,
                          spatial_merge_size=cfg.vision.spatial_merge_size)


jit_forward = jax.jit(forward, static_argnums=1)
