"""Qwen3-VL text decoder (q/k RMSNorm, GQA, SwiGLU, interleaved MRoPE, DeepStack) and the public entry points.

Shapes: B batch, L prompt length, S cache length, V vocab, N image tokens (after 2x2 merge).
Logits are returned in float32 whatever the compute dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.layers import rms_norm
from vlmgym.models.qwen3_vl.lora import project
from vlmgym.models.qwen3_vl.weights import Params

KVCache = dict[str, jax.Array]
NEG_INF = float(np.finfo(np.float32).min)


def _rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def mrope_cos_sin(cfg: Qwen3VLConfig, position_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """MRoPE cos/sin (B, L, head_dim) from (3, B, L) temporal/height/width positions.

    Interleaved (Qwen3-VL): frequency j takes the h row for j = 1, 4, 7, ... and the w row for j = 2, 5, 8, ...
    Chunked (Qwen2(.5)-VL, `mrope_interleaved=False`): the first mrope_section[0] frequencies take t, the next
    mrope_section[1] take h, the last mrope_section[2] take w.
    """
    t = cfg.text
    inv_freq = 1.0 / (t.rope_theta ** (np.arange(0, t.head_dim, 2, dtype=np.float32) / np.float32(t.head_dim)))
    if t.mrope_interleaved:
        row_of_freq = np.zeros(t.head_dim // 2, np.int32)
        row_of_freq[1:t.mrope_section[1] * 3:3] = 1
        row_of_freq[2:t.mrope_section[2] * 3:3] = 2
    else:
        row_of_freq = np.repeat(np.arange(3, dtype=np.int32), t.mrope_section)
    positions = jnp.moveaxis(position_ids[row_of_freq], 0, -1).astype(jnp.float32)  # (B, L, head_dim/2)
    freqs = positions * jnp.asarray(inv_freq.astype(np.float32))
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(cfg.compute_dtype), jnp.sin(emb).astype(cfg.compute_dtype)


def text_position_ids(attention_mask: jax.Array) -> jax.Array:
    """(3, B, L) positions for text-only prompts: consecutive over attended tokens."""
    pos = jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1
    pos = jnp.where(attention_mask.astype(bool), pos, 0)
    return jnp.broadcast_to(pos[None], (3,) + pos.shape)


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """GQA attention: q (B,T,Hq,D), k/v (B,S,Hkv,D), mask (B,T,S) bool -> (B,T,Hq*D); softmax in fp32."""
    b, t, n_q, d = q.shape
    n_kv = k.shape[2]
    q = q.reshape(b, t, n_kv, n_q // n_kv, d)  # query head j uses kv head j // group
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * (d**-0.5)
    scores = jnp.where(mask[:, None, None], scores, NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, n_q * d)


def _qkv(cfg: Qwen3VLConfig, p: Params, x: jax.Array, cos: jax.Array, sin: jax.Array):
    """Pre-norm, projections (+ bias where the params hold one: Qwen2), per-head q/k RMSNorm (where the params hold
    one: Qwen3), then rotary (B,T,heads,D)."""
    t = cfg.text
    b, length, _ = x.shape
    h = rms_norm(x, p["input_norm"]["scale"], t.rms_norm_eps)

    def heads(name: str, n: int) -> jax.Array:
        y = project(h, p[name])
        if "bias" in p[name]:
            y = y + p[name]["bias"]
        return y.reshape(b, length, n, t.head_dim)

    q, k, v = heads("q", t.num_attention_heads), heads("k", t.num_key_value_heads), heads("v", t.num_key_value_heads)
    if "q_norm" in p:
        q = rms_norm(q, p["q_norm"]["scale"], t.rms_norm_eps)
        k = rms_norm(k, p["k_norm"]["scale"], t.rms_norm_eps)
    c, s = cos[:, :, None], sin[:, :, None]
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s, v


def _attn_out_and_mlp(cfg: Qwen3VLConfig, p: Params, x: jax.Array, attn: jax.Array) -> jax.Array:
    x = x + project(attn, p["o"])
    h = rms_norm(x, p["post_norm"]["scale"], cfg.text.rms_norm_eps)
    return x + project(jax.nn.silu(project(h, p["gate"])) * project(h, p["up"]), p["down"])


def _cast(tree: Params, dtype: Any) -> Params:
    """Every leaf in `dtype`, except PRNG keys (a training forward's LoRA dropout keys, vlmgym...lora.train_mode)."""
    return jax.tree.map(lambda a: a if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a.astype(dtype),
                        tree)


def _embed(params: Params, cfg: Qwen3VLConfig, input_ids: jax.Array, image_embeds: jax.Array | None):
    """Token embeddings with image features written, in order, at the image-pad positions."""
    x = params["text"]["embed"][input_ids].astype(cfg.compute_dtype)
    if image_embeds is None:
        return x, None
    visual_mask = input_ids == cfg.image_token_id
    flat_index = jnp.cumsum(visual_mask.reshape(-1).astype(jnp.int32)) - 1
    feature_index = jnp.clip(flat_index.reshape(input_ids.shape), 0, image_embeds.shape[0] - 1)
    x = jnp.where(visual_mask[..., None], image_embeds[feature_index].astype(x.dtype), x)
    return x, (visual_mask, feature_index)


def check_image_tokens(cfg: Qwen3VLConfig, input_ids: Any, image_embeds: Any) -> None:
    """Raise (like transformers) when image-pad tokens and image features differ in number (host values only)."""
    if image_embeds is None or isinstance(input_ids, jax.core.Tracer):
        return
    n_tokens = int(np.sum(np.asarray(input_ids) == cfg.image_token_id))
    if n_tokens != image_embeds.shape[0]:
        raise ValueError(f"Image features and image tokens do not match, tokens: {n_tokens}, "
                         f"features: {image_embeds.shape[0]}")


def _decoder(params: Params, cfg: Qwen3VLConfig, x: jax.Array, position_ids: jax.Array, mask: jax.Array,
             visual: tuple[jax.Array, jax.Array] | None, deepstack_embeds: jax.Array | None, remat: bool = False):
    """All decoder layers over full sequences (one lax.scan); returns hidden states and per-layer (k, v).

    `remat` recomputes each layer's activations in the backward pass (jax.checkpoint) to save memory.
    """
    cos, sin = mrope_cos_sin(cfg, position_ids)
    n_taps = 0 if visual is None or deepstack_embeds is None else deepstack_embeds.shape[0]
    dtype = x.dtype

    def layer(h: jax.Array, xs: tuple[Params, jax.Array]):
        p, index = xs
        p = _cast(p, dtype)
        q, k, v = _qkv(cfg, p, h, cos, sin)
        h = _attn_out_and_mlp(cfg, p, h, _attention(q, k, v, mask))
        if n_taps:  # DeepStack: add tap `index` at the visual positions after each of the first n_taps layers
            visual_mask, feature_index = visual
            tap = deepstack_embeds[jnp.minimum(index, n_taps - 1)][feature_index].astype(dtype)
            h = h + jnp.where(visual_mask[..., None] & (index < n_taps), tap, jnp.zeros((), dtype))
        return h, (k, v)

    layers = params["text"]["layers"]
    return jax.lax.scan(jax.checkpoint(layer) if remat else layer, x, (layers, jnp.arange(cfg.text.num_hidden_layers)))


def _logits(params: Params, cfg: Qwen3VLConfig, h: jax.Array) -> jax.Array:
    """Final RMSNorm and lm_head (the transposed embedding when tied), float32 out."""
    h = rms_norm(h, params["text"]["norm"]["scale"], cfg.text.rms_norm_eps)
    if cfg.tie_word_embeddings:
        logits = jnp.einsum("...h,vh->...v", h, params["text"]["embed"].astype(h.dtype))
    else:
        logits = h @ params["lm_head"]["kernel"].astype(h.dtype)
    return logits.astype(jnp.float32)


def _full_mask(attention_mask: jax.Array) -> jax.Array:
    length = attention_mask.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    return causal[None] & attention_mask.astype(bool)[:, None, :]


def hidden_states(params: Params, cfg: Qwen3VLConfig, input_ids: jax.Array, attention_mask: jax.Array,
                  position_ids: jax.Array | None = None, image_embeds: jax.Array | None = None,
                  deepstack_embeds: jax.Array | None = None,
                  remat: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Last hidden states (B, L, hidden) before the final norm, plus stacked keys and values."""
    check_image_tokens(cfg, input_ids, image_embeds)
    if position_ids is None:
        position_ids = text_position_ids(attention_mask)
    x, visual = _embed(params, cfg, input_ids, image_embeds)
    h, (keys, values) = _decoder(params, cfg, x, position_ids, _full_mask(attention_mask), visual, deepstack_embeds,
                                 remat)
    return h, keys, values


def forward(params: Params, cfg: Qwen3VLConfig, input_ids: jax.Array, attention_mask: jax.Array,
            position_ids: jax.Array | None = None, image_embeds: jax.Array | None = None,
            deepstack_embeds: jax.Array | None = None) -> jax.Array:
    """Full forward: float32 logits (B, L, V)."""
    h, _, _ = hidden_states(params, cfg, input_ids, attention_mask, position_ids, image_embeds, deepstack_embeds)
    return _logits(params, cfg, h)


def _last_valid_index(attention_mask: jax.Array) -> jax.Array:
    """Index of the last attended token of each row (works for left and right padding)."""
    length = attention_mask.shape[1]
    return length - 1 - jnp.argmax(attention_mask.astype(bool)[:, ::-1], axis=1)


def _next_position(position_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """Rope position of the first generated token: max attended position + 1 (= length + rope_delta)."""
    top = jnp.where(attention_mask.astype(bool), position_ids.max(axis=0), -1).max(axis=1)
    return (top + 1).astype(jnp.int32)


def prefill(params: Params, cfg: Qwen3VLConfig, input_ids: jax.Array, attention_mask: jax.Array,
            position_ids: jax.Array | None = None, image_embeds: jax.Array | None = None,
            deepstack_embeds: jax.Array | None = None, *, cache_size: int,
            all_logits: bool = False) -> tuple[jax.Array, KVCache]:
    """Run the prompt, return logits ((B, V) at each row's last attended token, or (B, L, V)) and a KV cache."""
    batch, length = input_ids.shape
    if cache_size < length:
        raise ValueError(f"cache_size {cache_size} is shorter than the prompt ({length})")
    if position_ids is None:
        position_ids = text_position_ids(attention_mask)
    h, keys, values = hidden_states(params, cfg, input_ids, attention_mask, position_ids, image_embeds,
                                    deepstack_embeds)
    pad = [(0, 0), (0, 0), (0, cache_size - length), (0, 0), (0, 0)]
    cache = {
        "k": jnp.pad(keys, pad),
        "v": jnp.pad(values, pad),
        "valid": jnp.pad(attention_mask.astype(bool), [(0, 0), (0, cache_size - length)]),
        "index": jnp.asarray(length, jnp.int32),
        "next_position": _next_position(position_ids, attention_mask),
    }
    if all_logits:
        return _logits(params, cfg, h), cache
    last = h[jnp.arange(batch), _last_valid_index(attention_mask)]
    return _logits(params, cfg, last), cache


def _attention_with_new_token(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, cache_mask: jax.Array,
                              k_new: jax.Array, v_new: jax.Array) -> jax.Array:
    """Attention of one query per row over the cached keys (masked) plus its own new key, without writing it."""
    b, _, n_q, d = q.shape
    n_kv = k_cache.shape[2]
    q = q.reshape(b, n_kv, n_q // n_kv, d)
    scores_cache = jnp.einsum("bkgd,bskd->bkgs", q, k_cache.astype(q.dtype), preferred_element_type=jnp.float32)
    scores_new = jnp.einsum("bkgd,bkd->bkg", q, k_new[:, 0], preferred_element_type=jnp.float32)[..., None]
    scores = jnp.concatenate([jnp.where(cache_mask[:, None, None], scores_cache, NEG_INF), scores_new], -1)
    probs = jax.nn.softmax(scores * (d**-0.5), axis=-1).astype(v_cache.dtype)
    out = jnp.einsum("bkgs,bskd->bkgd", probs[..., :-1], v_cache)
    out = out + probs[..., -1:] * v_new[:, 0][:, :, None, :]
    return out.reshape(b, 1, n_q * d)


def decode_step(params: Params, cfg: Qwen3VLConfig, tokens: jax.Array, cache: KVCache,
                unroll: int | bool = 1) -> tuple[jax.Array, KVCache]:
    """One token per row: float32 logits (B, V) and the cache with the token written at slot `index`.

    The layer scan only reads the cache (each layer attends over its cached keys plus the new key); the new
    keys/values of all layers are written afterwards with one dynamic_update_slice, in place when the
    cache is donated. `unroll=True` unrolls the layer scan: on an H200 (4B, bf16) it halves the step time
    (XLA then reads each layer's weights in place instead of copying a slice) but compiles ~60 s instead of ~2 s.
    """
    dtype = cfg.compute_dtype
    index = cache["index"]
    batch = tokens.shape[0]
    x = params["text"]["embed"][tokens][:, None].astype(dtype)  # (B, 1, hidden)
    positions = jnp.broadcast_to(cache["next_position"][None, :, None], (3, batch, 1))
    cos, sin = mrope_cos_sin(cfg, positions)

    def layer(h, xs):
        p, k_cache, v_cache = xs
        p = _cast(p, dtype)
        q, k, v = _qkv(cfg, p, h, cos, sin)
        attn = _attention_with_new_token(q, k_cache, v_cache, cache["valid"], k, v)
        return _attn_out_and_mlp(cfg, p, h, attn), (k, v)

    h, (k_new, v_new) = jax.lax.scan(layer, x, (params["text"]["layers"], cache["k"], cache["v"]), unroll=unroll)
    start = (0, 0, index, 0, 0)
    new_cache = {
        "k": jax.lax.dynamic_update_slice(cache["k"], k_new.astype(cache["k"].dtype), start),
        "v": jax.lax.dynamic_update_slice(cache["v"], v_new.astype(cache["v"].dtype), start),
        "valid": jax.lax.dynamic_update_slice(cache["valid"], jnp.ones((batch, 1), bool), (0, index)),
        "index": index + 1,
        "next_position": cache["next_position"] + 1,
    }
    return _logits(params, cfg, h[:, 0]), new_cache


def repeat_cache(cache: KVCache, repeats: int) -> KVCache:
    """Repeat every row `repeats` times along the batch axis (one prefill shared by a sampling group)."""
    out = dict(cache)
    for name in ("k", "v"):
        out[name] = jnp.repeat(cache[name], repeats, axis=1)
    for name in ("valid", "next_position"):
        out[name] = jnp.repeat(cache[name], repeats, axis=0)
    return out


def encode_inputs(params: Params, cfg: Qwen3VLConfig, inputs: dict[str, Any], remat: bool = False):
    """Image embeds and DeepStack embeds of a batch dict with `pixel_values` + `patch_layout` (None if no images),
    by the vision tower of cfg's family (Qwen2.5-VL has no DeepStack: None)."""
    if inputs.get("pixel_values") is None:
        return None, None
    from vlmgym.models.family import family_of

    return family_of(cfg).encode(params, cfg, inputs["pixel_values"], inputs["patch_layout"], remat)


def token_logprobs(params: Params, cfg: Qwen3VLConfig, inputs: dict[str, Any], completion_ids: jax.Array,
                   completion_mask: jax.Array, remat: bool = False, temperature: float = 1.0,
                   with_features: bool = False, with_entropy: bool = False) -> Any:
    """Log-probs (B, C) of completions that follow the prompts in `inputs`, under the softmax of the logits divided
    by `temperature` (the sampler's, so importance ratios compare the policy that was sampled); 0 where masked.

    `inputs`: input_ids / attention_mask (B, L) prompts (left or right padded), optional position_ids (3, B, L),
    optional pixel_values + patch_layout. Completion token j sits right after the prompt block.
    `remat=True` trades recomputation for activation memory under jax.grad (each decoder layer and vision block
    is checkpointed). `with_features=True` also returns the final-normed hidden states that predict each
    completion token (B, C, hidden), float32: a value head's input. `with_entropy=True` returns (log-probs,
    entropies) in place of the log-probs: each position's entropy of that tempered softmax (B, C), 0 where masked.
    """
    prompt_mask = inputs["attention_mask"].astype(jnp.int32)
    prompt_positions = inputs.get("position_ids")
    if prompt_positions is None:
        prompt_positions = text_position_ids(prompt_mask)
    image_embeds, deepstack_embeds = encode_inputs(params, cfg, inputs, remat)
    batch, length = inputs["input_ids"].shape
    steps = completion_ids.shape[1]
    first = _next_position(prompt_positions, prompt_mask)
    completion_positions = first[:, None] + jnp.arange(steps, dtype=jnp.int32)[None]
    position_ids = jnp.concatenate(
        [prompt_positions.astype(jnp.int32), jnp.broadcast_to(completion_positions[None], (3, batch, steps))], axis=2)
    attention_mask = jnp.concatenate([prompt_mask, completion_mask.astype(jnp.int32)], axis=1)
    check_image_tokens(cfg, inputs["input_ids"], image_embeds)
    # Completion tokens are embedded as plain tokens, as the sampler decoded them: a sampled <|image_pad|> is not
    # an image slot (written with image features, it would also shift the features of every later row).
    x, visual = _embed(params, cfg, inputs["input_ids"], image_embeds)
    x = jnp.concatenate([x, params["text"]["embed"][completion_ids].astype(x.dtype)], axis=1)
    if visual is not None:
        visual = tuple(jnp.pad(a, [(0, 0), (0, steps)]) for a in visual)
    h, _ = _decoder(params, cfg, x, position_ids, _full_mask(attention_mask), visual, deepstack_embeds, remat)
    # Token j is predicted at position length + j - 1, except token 0: at the prompt's last attended token.
    predict_at = length + jnp.arange(steps)[None] - 1
    predict_at = jnp.where(jnp.arange(steps)[None] == 0, _last_valid_index(prompt_mask)[:, None], predict_at)
    predictors = jnp.take_along_axis(h, predict_at[..., None], axis=1)
    scored = picked_logprobs(params, cfg, predictors, completion_ids, completion_mask, temperature, with_entropy)
    return (scored, final_features(params, cfg, predictors)) if with_features else scored


def final_features(params: Params, cfg: Qwen3VLConfig, h: jax.Array) -> jax.Array:
    """The final RMSNorm of hidden states (what lm_head reads), float32."""
    return rms_norm(h, params["text"]["norm"]["scale"], cfg.text.rms_norm_eps).astype(jnp.float32)


def picked_logprobs(params: Params, cfg: Qwen3VLConfig, h: jax.Array, completion_ids: jax.Array,
                    completion_mask: jax.Array, temperature: float, with_entropy: bool = False) -> Any:
    """Log-probs (B, C) of completion_ids from the hidden states (B, C, hidden) that predict them; 0 where masked.
    with_entropy: (log-probs, each position's entropy over the vocabulary), both 0 where masked."""
    logits = _logits(params, cfg, h)
    if temperature != 1.0:  # a static Python float: the default's program has no division
        logits = logits.astype(jnp.float32) / jnp.float32(temperature)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logprobs, completion_ids[..., None].astype(jnp.int32), axis=-1)[..., 0]
    valid = completion_mask.astype(bool)
    picked = jnp.where(valid, picked, 0.0)
    if not with_entropy:
        return picked
    full = logprobs.astype(jnp.float32)
    entropy = -(jnp.exp(full) * full).sum(axis=-1)
    return picked, jnp.where(valid, entropy, 0.0)


jit_forward = jax.jit(forward, static_argnums=1)
jit_prefill = jax.jit(prefill, static_argnums=1, static_argnames=("cache_size", "all_logits"))
jit_decode_step = jax.jit(decode_step, static_argnums=1, static_argnames="unroll", donate_argnums=3)
jit_token_logprobs = jax.jit(token_logprobs, static_argnums=1,
                             static_argnames=("remat", "temperature", "with_features", "with_entropy"))
