"""Qwen3-VL in JAX: model, HF <-> JAX conversion, sharding, parity, processor.

Parameters are a nested dict of arrays (per-layer weights stacked on a leading axis,
dense kernels (in, out)); `param_axes(cfg)` is the parallel tree of logical axis names.
`cfg` (a frozen, hashable `Qwen3VLConfig`) is always a static jit argument. Logits are
float32. Shapes: B batch, L prompt length, S cache length, N image tokens (after 2x2 merge).

Vision (`vision.py`)
    patch_layout(cfg, grid_thw, pad_to=None) -> layout      host numpy: position taps, rotary coordinates and
        per-frame attention blocks (cost ~ sum of squared frame sizes, not (all patches)^2)
    encode_patches(params, cfg, pixel_values (P, 1536), layout) -> (image_embeds (N, hidden),
        deepstack_embeds (taps, N, hidden))                  jittable; recompiles only when P, the number
        of frames or the longest frame change
    encode_images(params, cfg, pixel_values, grid_thw)      host wrapper of the two above (jitted)

Text / entry points (`model.py`)
    forward(params, cfg, input_ids (B,L), attention_mask (B,L), position_ids (3,B,L)|None,
            image_embeds|None, deepstack_embeds|None) -> logits (B, L, V)
    prefill(..same inputs.., *, cache_size, all_logits=False) -> (logits (B,V) at each row's last attended
            token [or (B,L,V)], cache)
    decode_step(params, cfg, tokens (B,), cache, unroll=1) -> (logits (B, V), cache)   unroll=True: ~2x faster
        steps on GPU for a much longer compile (see its docstring)
    repeat_cache(cache, repeats) -> cache                   group sampling: one prefill, G rows each
    token_logprobs(params, cfg, inputs, completion_ids (B,C), completion_mask (B,C), remat=False, temperature=1.0)
        -> (B, C) log-probs (of the logits / temperature, 0 where masked);
        inputs = {input_ids, attention_mask, [position_ids], [pixel_values, patch_layout]}; differentiable;
        remat=True checkpoints each layer under jax.grad
    jit_forward / jit_prefill / jit_decode_step (cache donated) / jit_token_logprobs: module-level jits

    The KV cache is a dict: k, v (layers, B, S, kv_heads, head_dim); valid (B, S) bool (which slots hold real
    tokens: prompt padding stays False, so left- and right-padded prompts both work); index () int32 (next slot
    to write, the same for all rows); next_position (B,) int32 (MRoPE position of the next token = prompt max
    position + 1 + steps so far, i.e. HF's length + rope_delta). Every decode step writes one slot with
    lax.dynamic_update_slice and attends over all S slots with the valid mask, so a decode loop runs in
    lax.while_loop with static shapes. Writing past S is the caller's bug (XLA clamps the index).
    Prompt position ids come from `processor.get_rope_index` (or HF's); None means text-only positions.
    Image features fill the image-pad positions in order; a count mismatch raises when input_ids are host
    values (as transformers does) but cannot be checked inside jit.

HF layout (`convert.py`)
    hf_to_params(state, cfg) / params_to_hf(params, cfg)      strict: unmatched / missing key, bad shape -> error;
        values copied exactly; read_safetensors(folder), write_safetensors(state, folder)
    Checkpoint folders of either family (convert in, save / load, export back, checked bit-exact) are
    vlmgym.models.checkpoint's.

Config / params / sharding
    load_hf_config(path_or_dir), named_config("2b" | "4b" | "8b"), cfg.with_dtypes(dtype, param_dtype)
    init_params(cfg, key), abstract_params(cfg), param_axes(cfg), count_params(tree)
    make_mesh(data, fsdp, tensor), param_shardings(cfg, mesh), shard_params(params, cfg, mesh),
    batch_sharding(mesh, ndim, batch_axis, batch), cache_shardings(cache, mesh), ShardingRules

Parity: `vlmgym parity --hf DIR --jax DIR [--image PATH ...] [--prompt TEXT] [--dtype fp32|bf16]`
(parity.main), parity.run_parity(hf_dir, jax_dir, cases, dtype, tolerance), and parity.convert_and_check(hf_dir,
jax_dir, dtype, tolerance) for the convert stage. The transformers side of every comparison (parity, export
check, the HF baseline, the rollout benchmark) loads and feeds the model through `hf_reference.py`.

Base checkpoint (`base_model.py`): the tiny random Qwen3-VL with its own tokenizer (trained on a corpus the
caller passes) or a hub snapshot, written as an HF folder.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "config": ("Qwen3VLConfig", "TextConfig", "VisionConfig", "ConfigError", "load_hf_config", "named_config",
               "from_hf_dict"),
    "params": ("init_params", "abstract_params", "param_axes", "param_specs", "count_params", "cast_params"),
    "vision": ("patch_layout", "encode_patches", "encode_images"),
    "model": ("forward", "prefill", "decode_step", "repeat_cache", "token_logprobs", "hidden_states",
              "text_position_ids", "KVCache", "jit_forward", "jit_prefill", "jit_decode_step", "jit_token_logprobs"),
    "convert": ("ConversionError", "hf_to_params", "params_to_hf", "read_safetensors", "write_safetensors"),
    "sharding": ("ShardingRules", "make_mesh", "param_shardings", "shard_params", "batch_sharding",
                 "cache_shardings"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    # Lazy so that `processor` / `base_model` / `hf_reference` users do not import jax.
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
