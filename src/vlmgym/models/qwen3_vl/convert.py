"""Qwen3-VL's HF safetensors layout <-> JAX params, and the safetensors files every family's checkpoints use.

The key table is built from the config, so every expected tensor is known up front:
a checkpoint key that matches nothing, an expected key that is absent, or a shape that
differs is an error naming the key. Values are copied exactly (only transposed or
reshaped), so HF -> JAX -> HF is bit-exact. Another family (vlmgym.models.qwen2_5_vl.convert) passes its own key
table to the same functions; checkpoint folders (orbax params, export, the export check) are
vlmgym.models.checkpoint's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy so safetensors can read bf16 as numpy)
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.weights import Params, abstract_params

MAX_SHARD_BYTES = 4 * 1024**3


class ConversionError(ValueError):
    """A checkpoint does not match the architecture (names the key)."""



def _key_table(cfg: Qwen3VLConfig) -> Iterator[tuple[str, tuple[str, ...], int | None, str]]:
    """(HF key without 'model.', params path, stacked index or None, kind: 'copy' | 'linear' | 'patch')."""
    yield "visual.patch_embed.proj.weight", ("visual", "patch_embed", "kernel"), None, "patch"
    yield "visual.patch_embed.proj.bias", ("visual", "patch_embed", "bias"), None, "copy"
    yield "visual.pos_embed.weight", ("visual", "pos_embed"), None, "copy"
    for i in range(cfg.vision.depth):
        base = f"visual.blocks.{i}."
        for hf_name, name in (("norm1", "norm1"), ("norm2", "norm2")):
            yield base + hf_name + ".weight", ("visual", "blocks", name, "scale"), i, "copy"
            yield base + hf_name + ".bias", ("visual", "blocks", name, "bias"), i, "copy"
        for hf_name, name in (("attn.qkv", "qkv"), ("attn.proj", "proj"), ("mlp.linear_fc1", "fc1"),
                              ("mlp.linear_fc2", "fc2")):
            yield base + hf_name + ".weight", ("visual", "blocks", name, "kernel"), i, "linear"
            yield base + hf_name + ".bias", ("visual", "blocks", name, "bias"), i, "copy"
    mergers = [("visual.merger.", ("visual", "merger"), None)]
    mergers += [(f"visual.deepstack_merger_list.{k}.", ("visual", "deepstack"), k)
                for k in range(len(cfg.vision.deepstack_visual_indexes))]
    for base, path, index in mergers:
        yield base + "norm.weight", path + ("norm", "scale"), index, "copy"
        yield base + "norm.bias", path + ("norm", "bias"), index, "copy"
        for hf_name, name in (("linear_fc1", "fc1"), ("linear_fc2", "fc2")):
            yield base + hf_name + ".weight", path + (name, "kernel"), index, "linear"
            yield base + hf_name + ".bias", path + (name, "bias"), index, "copy"
    yield "language_model.embed_tokens.weight", ("text", "embed"), None, "copy"
    for i in range(cfg.text.num_hidden_layers):
        base = f"language_model.layers.{i}."
        layer = ("text", "layers")
        yield base + "input_layernorm.weight", layer + ("input_norm", "scale"), i, "copy"
        yield base + "post_attention_layernorm.weight", layer + ("post_norm", "scale"), i, "copy"
        for proj in "qkvo":
            yield base + f"self_attn.{proj}_proj.weight", layer + (proj, "kernel"), i, "linear"
        yield base + "self_attn.q_norm.weight", layer + ("q_norm", "scale"), i, "copy"
        yield base + "self_attn.k_norm.weight", layer + ("k_norm", "scale"), i, "copy"
        for proj in ("gate", "up", "down"):
            yield base + f"mlp.{proj}_proj.weight", layer + (proj, "kernel"), i, "linear"
    yield "language_model.norm.weight", ("text", "norm", "scale"), None, "copy"
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", ("lm_head", "kernel"), None, "linear"



def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        tree = tree[name]
    return tree



def _hf_shape(shape: tuple[int, ...], kind: str, cfg: Qwen3VLConfig) -> tuple[int, ...]:
    if kind == "linear":
        return (shape[1], shape[0])
    if kind == "patch":
        v = cfg.vision
        return (shape[1], v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    return shape



def _strip(key: str) -> str:
    return key[len("model."):] if key.startswith("model.") else key



def hf_to_params(state: dict[str, np.ndarray], cfg: Qwen3VLConfig, *,
                 key_table: Callable[[Any], Iterator] | None = None, abstract: Params | None = None) -> Params:
    """Params tree (numpy, checkpoint dtype) from an HF state dict; strict about keys and shapes.

    `key_table` / `abstract` default to Qwen3-VL's; another family (qwen2_5_vl) passes its own.
    """
    bare = {}
    for key, value in state.items():
        name = _strip(key)
        if name in bare:
            raise ConversionError(f"key {key!r} appears twice (with and without the 'model.' prefix)")
        bare[name] = value
    abstract = abstract_params(cfg) if abstract is None else abstract
    table = list((key_table or _key_table)(cfg))
    expected = {hf for hf, *_ in table}
    # Some exports write the tied head too; accept it only when it really equals the embedding.
    if cfg.tie_word_embeddings and "lm_head.weight" in bare and not np.array_equal(
            bare.pop("lm_head.weight"), bare.get("language_model.embed_tokens.weight")):
        raise ConversionError("key 'lm_head.weight': present and different from the embedding, but the config "
                                  "says tie_word_embeddings=true")
    unknown = sorted(set(bare) - expected)
    if unknown:
        raise ConversionError(f"unexpected key {unknown[0]!r} in checkpoint ({len(unknown)} unmatched in all)")
    stacked: dict[tuple[str, ...], list[Any]] = {}
    out: dict[tuple[str, ...], np.ndarray] = {}
    for hf, path, index, kind in table:
        if hf not in bare:
            raise ConversionError(f"missing key {hf!r} in checkpoint")
        target = _get(abstract, path).shape
        per_item = target[1:] if index is not None else target
        want = _hf_shape(per_item, kind, cfg)
        value = np.asarray(bare[hf])
        if tuple(value.shape) != tuple(want):
            raise ConversionError(f"key {hf!r}: shape {tuple(value.shape)} != expected {tuple(want)}")
        if kind == "linear":
            value = value.T
        elif kind == "patch":
            value = value.reshape(value.shape[0], -1).T
        if index is None:
            out[path] = np.ascontiguousarray(value)
        else:
            stacked.setdefault(path, [None] * target[0])[index] = value
    for path, items in stacked.items():
        out[path] = np.stack(items)
    dtypes = {a.dtype for a in out.values()}
    if len(dtypes) != 1:
        raise ConversionError(f"checkpoint mixes dtypes {sorted(str(d) for d in dtypes)}")
    params: Params = {}
    for path, value in out.items():
        node = params
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = value
    return params



def params_to_hf(params: Params, cfg: Qwen3VLConfig, *,
                 key_table: Callable[[Any], Iterator] | None = None) -> dict[str, np.ndarray]:
    """HF state dict ('model.'-prefixed keys, (out, in) linear weights) from a params tree."""
    state = {}
    v = cfg.vision
    for hf, path, index, kind in (key_table or _key_table)(cfg):
        value = np.asarray(_get(params, path))
        if index is not None:
            value = value[index]
        if kind == "linear":
            value = value.T
        elif kind == "patch":
            value = value.T.reshape(-1, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
        key = hf if hf == "lm_head.weight" else "model." + hf
        state[key] = np.ascontiguousarray(value)
    return state



def read_safetensors(folder: str | Path) -> dict[str, np.ndarray]:
    """All tensors of a folder: sharded (model.safetensors.index.json) or single-file safetensors."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{folder}: no safetensors files")
    state: dict[str, np.ndarray] = {}
    for name in files:
        with safe_open(str(folder / name), framework="numpy") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                if key in state:
                    raise ConversionError(f"key {key!r} is in more than one safetensors file")
                state[key] = f.get_tensor(key)
    return state



def to_hf_dict(cfg: Qwen3VLConfig) -> dict[str, Any]:
    """An HF config.json dict (5.x layout) describing `cfg`."""
    t, v = cfg.text, cfg.vision
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "tie_word_embeddings": cfg.tie_word_embeddings, "image_token_id": cfg.image_token_id,
        "video_token_id": cfg.video_token_id, "vision_start_token_id": cfg.vision_start_token_id,
        "vision_end_token_id": cfg.vision_end_token_id,
        "text_config": {
            "model_type": "qwen3_vl_text", "vocab_size": t.vocab_size, "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size, "num_hidden_layers": t.num_hidden_layers,
            "num_attention_heads": t.num_attention_heads, "num_key_value_heads": t.num_key_value_heads,
            "head_dim": t.head_dim, "rms_norm_eps": t.rms_norm_eps, "hidden_act": t.hidden_act,
            "max_position_embeddings": t.max_position_embeddings, "tie_word_embeddings": cfg.tie_word_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": t.rope_theta,
                                "mrope_section": list(t.mrope_section), "mrope_interleaved": True},
        },
        "vision_config": {
            "model_type": "qwen3_vl_vision", "depth": v.depth, "hidden_size": v.hidden_size,
            "intermediate_size": v.intermediate_size, "num_heads": v.num_heads, "out_hidden_size": v.out_hidden_size,
            "deepstack_visual_indexes": list(v.deepstack_visual_indexes), "in_channels": v.in_channels,
            "patch_size": v.patch_size, "temporal_patch_size": v.temporal_patch_size,
            "spatial_merge_size": v.spatial_merge_size, "num_position_embeddings": v.num_position_embeddings,
            "hidden_act": v.hidden_act,
        },
    }



def write_safetensors(state: dict[str, np.ndarray], folder: Path) -> None:
    """One model.safetensors, or shards + model.safetensors.index.json past MAX_SHARD_BYTES."""
    total = sum(a.nbytes for a in state.values())
    if total <= MAX_SHARD_BYTES:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for key, value in state.items():
        if size and size + value.nbytes > MAX_SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][key] = value
        size += value.nbytes
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")

