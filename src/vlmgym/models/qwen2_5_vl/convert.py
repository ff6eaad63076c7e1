"""HF Qwen2.5-VL safetensors <-> JAX params (strict, bit-exact both ways), on Qwen3-VL's converter.

transformers 5.24 keeps `model.visual.*` / `model.language_model.*` in memory but `save_pretrained` writes the
hub layout: `visual.*`, `model.*` (text) and `lm_head.weight`. Reading accepts either layout (never a mix of
both for one tensor); writing produces the hub layout. Internally keys are named like Qwen3-VL's bare keys
(`visual.*`, `language_model.*`) so the shared strict table machinery applies unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from vlmgym.models.qwen2_5_vl.config import ARCHITECTURE, Qwen25VLConfig, from_hf_dict
from vlmgym.models.qwen2_5_vl.weights import abstract_params
from vlmgym.models.qwen3_vl import convert as qwen3_convert
from vlmgym.models.qwen3_vl.convert import ConversionError, read_safetensors, write_safetensors
from vlmgym.models.qwen3_vl.weights import Params

__all__ = ["ConversionError", "hf_to_params", "params_to_hf", "load_hf_folder", "save_hf_folder", "key_table"]


def key_table(cfg: Qwen25VLConfig) -> Iterator[tuple[str, tuple[str, ...], int | None, str]]:
    """(bare HF key, params path, stacked index or None, kind: 'copy' | 'linear' | 'patch')."""
    yield "visual.patch_embed.proj.weight", ("visual", "patch_embed", "kernel"), None, "patch"
    for i in range(cfg.vision.depth):
        base = f"visual.blocks.{i}."
        block = ("visual", "blocks")
        yield base + "norm1.weight", block + ("norm1", "scale"), i, "copy"
        yield base + "norm2.weight", block + ("norm2", "scale"), i, "copy"
        for hf_name, name in (("attn.qkv", "qkv"), ("attn.proj", "proj"), ("mlp.gate_proj", "gate"),
                              ("mlp.up_proj", "up"), ("mlp.down_proj", "down")):
            yield base + hf_name + ".weight", block + (name, "kernel"), i, "linear"
            yield base + hf_name + ".bias", block + (name, "bias"), i, "copy"
    yield "visual.merger.ln_q.weight", ("visual", "merger", "norm", "scale"), None, "copy"
    for hf_name, name in (("mlp.0", "fc1"), ("mlp.2", "fc2")):
        yield f"visual.merger.{hf_name}.weight", ("visual", "merger", name, "kernel"), None, "linear"
        yield f"visual.merger.{hf_name}.bias", ("visual", "merger", name, "bias"), None, "copy"
    yield "language_model.embed_tokens.weight", ("text", "embed"), None, "copy"
    layer = ("text", "layers")
    for i in range(cfg.text.num_hidden_layers):
        base = f"language_model.layers.{i}."
        yield base + "input_layernorm.weight", layer + ("input_norm", "scale"), i, "copy"
        yield base + "post_attention_layernorm.weight", layer + ("post_norm", "scale"), i, "copy"
        for proj in "qkvo":
            yield base + f"self_attn.{proj}_proj.weight", layer + (proj, "kernel"), i, "linear"
        for proj in "qkv":
            yield base + f"self_attn.{proj}_proj.bias", layer + (proj, "bias"), i, "copy"
        for proj in ("gate", "up", "down"):
            yield base + f"mlp.{proj}_proj.weight", layer + (proj, "kernel"), i, "linear"
    yield "language_model.norm.weight", ("text", "norm", "scale"), None, "copy"
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", ("lm_head", "kernel"), None, "linear"


def _bare(key: str) -> str:
    """Either HF layout -> the table's names ('visual.*', 'language_model.*', 'lm_head.weight')."""
    for prefix, replacement in (("model.visual.", "visual."), ("model.language_model.", "language_model."),
                                ("visual.", "visual."), ("model.", "language_model.")):
        if key.startswith(prefix):
            return replacement + key[len(prefix):]
    return key


def _hub(key: str) -> str:
    """The table's name -> the name `save_pretrained` writes."""
    if key.startswith("language_model."):
        return "model." + key[len("language_model."):]
    return key


def hf_to_params(state: dict[str, np.ndarray], cfg: Qwen25VLConfig) -> Params:
    """Params tree (numpy, checkpoint dtype) from an HF state dict in either layout; strict about keys/shapes."""
    bare: dict[str, np.ndarray] = {}
    for key, value in state.items():
        name = _bare(key)
        if name in bare:
            raise ConversionError(f"key {key!r} appears twice (in both the hub and the in-memory layout)")
        bare[name] = value
    return qwen3_convert.hf_to_params(bare, cfg, key_table=key_table, abstract=abstract_params(cfg))


def params_to_hf(params: Params, cfg: Qwen25VLConfig) -> dict[str, np.ndarray]:
    """HF state dict in the layout `Qwen2_5_VLForConditionalGeneration.save_pretrained` writes."""
    state = qwen3_convert.params_to_hf(params, cfg, key_table=key_table)
    return {_hub(qwen3_convert._strip(key)): value for key, value in state.items()}


def load_hf_folder(folder: str | Path, dtype: str = "fp32") -> tuple[Qwen25VLConfig, Params]:
    """(config, numpy params in the checkpoint's dtype) from a transformers Qwen2.5-VL folder."""
    folder = Path(folder)
    cfg = from_hf_dict(json.loads((folder / "config.json").read_text()), dtype=dtype)
    return cfg, hf_to_params(read_safetensors(folder), cfg)


def save_hf_folder(folder: str | Path, cfg: Qwen25VLConfig, params: Params, hf_config: dict) -> Path:
    """Write safetensors (hub layout) + config.json: a folder transformers loads as Qwen2.5-VL."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(hf_config)
    config.setdefault("architectures", [ARCHITECTURE])
    write_safetensors(params_to_hf(params, cfg), folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
