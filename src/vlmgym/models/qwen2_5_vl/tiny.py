"""The tiny random Qwen2.5-VL of `model.tiny_family: qwen2_5_vl`: the tiny Qwen3-VL's dimensions
(vlmgym.models.qwen3_vl.base_model.TinyDims) on Qwen2.5-VL's architecture.

Differences from the tiny Qwen3-VL: 14-pixel patches (a 256x192 image still becomes 84x112 pixels = 3x4 merged
tokens = 12 under the tiny pixel budget), window attention in 56-pixel windows (2x2 merged patches, so a tiny image
has several windows; the hub's are 112) with the last vision block attending over the whole image, q/k/v biases and
chunked MRoPE in the decoder, no DeepStack, CLIP mean / std and the Instruct chat template with its default system
prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TINY_WINDOW_SIZE = 56


def tiny_config(ids: Mapping[str, int], vocab_size: int, dims: Any) -> Any:
    """An explicit transformers `Qwen2_5_VLConfig` for the tiny model: `ids` are the tokenizer's ids of its special
    tokens (vlmgym.models.qwen3_vl.base_model.SPECIAL_TOKENS), `vocab_size` its length."""
    from transformers import Qwen2_5_VLConfig

    if dims.hidden_size // dims.num_heads != dims.head_dim:
        raise ValueError(f"invalid tiny Qwen2.5-VL dims: head_dim {dims.head_dim} must be hidden_size / num_heads "
                         f"({dims.hidden_size} / {dims.num_heads}); Qwen2.5-VL has no head_dim of its own")
    if sum(dims.mrope_section) != dims.head_dim // 2 or dims.num_heads % dims.num_kv_heads:
        raise ValueError(f"invalid tiny Qwen2.5-VL dims: mrope_section {dims.mrope_section} must sum to head_dim/2 "
                         f"and num_heads {dims.num_heads} be a multiple of num_kv_heads {dims.num_kv_heads}")
    text_config = {
        "vocab_size": vocab_size, "hidden_size": dims.hidden_size, "intermediate_size": dims.intermediate_size,
        "num_hidden_layers": dims.num_layers, "num_attention_heads": dims.num_heads,
        "num_key_value_heads": dims.num_kv_heads, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "max_position_embeddings": dims.max_position_embeddings, "tie_word_embeddings": dims.tie_word_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": dims.rope_theta,
                            "mrope_section": list(dims.mrope_section)},
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
    }
    vision_config = {
        "depth": dims.vision_depth, "hidden_size": dims.vision_hidden_size, "hidden_act": "silu",
        "intermediate_size": dims.vision_intermediate_size, "num_heads": dims.vision_heads, "in_channels": 3,
        "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": dims.hidden_size,
        "window_size": TINY_WINDOW_SIZE, "fullatt_block_indexes": [dims.vision_depth - 1],
    }
    return Qwen2_5_VLConfig(text_config=text_config, vision_config=vision_config,
                            image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                            vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                            tie_word_embeddings=dims.tie_word_embeddings)


def tiny_dims_summary(dims: Any) -> dict[str, Any]:
    """The dimensions the tiny Qwen2.5-VL is built with (TinyDims less what Qwen2.5-VL has not, plus its windows)."""
    from dataclasses import asdict

    out = {k: v for k, v in asdict(dims).items() if k not in ("deepstack_visual_indexes", "num_position_embeddings")}
    return {**out, "window_size": TINY_WINDOW_SIZE, "fullatt_block_indexes": [dims.vision_depth - 1]}
