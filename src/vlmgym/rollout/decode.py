"""A decode step for sampling groups: the prompt's KV cache is stored once per prompt, not once per sample.

`model.decode_step` attends over a (batch, cache) KV cache, so a group of G samples of one prompt reads G
copies of the prompt's keys and values every step. Here the cache is split in two:
- the prompt part, (layers, prompts, kv_heads, ...) over prompt_len positions, written once by the prefill and
  read once per prompt per step (the G queries of a group attend to it together);
- the generated part, (layers, prompts * G, kv_heads, ...) over max_new_tokens positions, one row per sample.
The two score blocks are joined before one fp32 softmax, so the result is the same attention as over a
single concatenated cache. Per step this reads prompts * prompt_len + rows * step KV entries instead of
rows * (prompt_len + max_new_tokens), which is most of the memory traffic of a decode step once prompts
carry images. The projections, norms, MLP and logits are the model's own functions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.layers import rms_norm
from vlmgym.models.qwen3_vl.model import NEG_INF, KVCache, _attn_out_and_mlp, _qkv, mrope_cos_sin
from vlmgym.models.qwen3_vl.weights import Params

GroupCache = dict[str, jax.Array]


def group_cache(cfg: Qwen3VLConfig, prompt_cache: KVCache, group_size: int, max_new_tokens: int) -> GroupCache:
    """The split cache from the model's prefill cache (sized to the prompt): prompt part + empty generated part.

    Keys are stored (..., kv_heads, head_dim, positions) and values (..., kv_heads, positions, head_dim), the
    operand layouts of the two attention matmuls, so XLA does not transpose the cache on every step (on XLA:CPU
    those per-layer transposes of the generated cache were a fifth of a decode step).
    """
    layers, prompts, _, kv_heads, head_dim = prompt_cache["k"].shape
    rows = prompts * group_size
    dtype = prompt_cache["k"].dtype
    prompt_k = jnp.transpose(prompt_cache["k"], (0, 1, 3, 4, 2))
    prompt_v = jnp.transpose(prompt_cache["v"], (0, 1, 3, 2, 4))
    return {
        "prompt_k": tuple(prompt_k[i] for i in range(layers)),
        "prompt_v": tuple(prompt_v[i] for i in range(layers)),
        "prompt_valid": prompt_cache["valid"],
        "gen_k": tuple(jnp.zeros((rows, kv_heads, head_dim, max_new_tokens), dtype) for _ in range(layers)),
        "gen_v": tuple(jnp.zeros((rows, kv_heads, max_new_tokens, head_dim), dtype) for _ in range(layers)),
        "next_position": jnp.repeat(prompt_cache["next_position"], group_size, axis=0),
    }


def _group_attention(q: jax.Array, prompt_k: jax.Array, prompt_v: jax.Array, prompt_valid: jax.Array,
                     gen_k: jax.Array, gen_v: jax.Array, step: jax.Array) -> jax.Array:
    """Attention of one new token per row over its prompt (shared by the group) and its own generated tokens.

    q (rows, 1, q_heads, d); prompt_k (prompts, kv, d, L), prompt_v (prompts, kv, L, d); prompt_valid
    (prompts, L); gen_k (rows, kv, d, T), gen_v (rows, kv, T, d).
    """
    rows, _, n_q, d = q.shape
    prompts, n_kv, _, prompt_len = prompt_k.shape
    group, per_kv = rows // prompts, n_q // n_kv
    scale = d**-0.5
    q_prompt = jnp.transpose(q.reshape(prompts, group, n_kv, per_kv, d), (0, 2, 1, 3, 4))  # (p, k, g, h, d)
    prompt_scores = jnp.einsum("pkghd,pkdl->pkghl", q_prompt, prompt_k, preferred_element_type=jnp.float32) * scale
    prompt_scores = jnp.where(prompt_valid[:, None, None, None, :], prompt_scores, NEG_INF)
    prompt_scores = jnp.transpose(prompt_scores, (0, 2, 1, 3, 4)).reshape(rows, n_kv, per_kv, prompt_len)
    q_rows = q.reshape(rows, n_kv, per_kv, d)
    gen_scores = jnp.einsum("bkhd,bkdt->bkht", q_rows, gen_k, preferred_element_type=jnp.float32) * scale
    gen_scores = jnp.where(jnp.arange(gen_k.shape[-1])[None, None, None, :] <= step, gen_scores, NEG_INF)
    probs = jax.nn.softmax(jnp.concatenate([prompt_scores, gen_scores], axis=-1), axis=-1).astype(prompt_v.dtype)
    prompt_probs = probs[..., :prompt_len].reshape(prompts, group, n_kv, per_kv, prompt_len)
    out = jnp.einsum("pgkhl,pkld->pgkhd", prompt_probs, prompt_v).reshape(rows, n_kv, per_kv, d)
    out = out + jnp.einsum("bkht,bktd->bkhd", probs[..., prompt_len:], gen_v)
    return out.reshape(rows, 1, n_q * d)


def lm_head_kernel(params: Params, cfg: Qwen3VLConfig) -> jax.Array:
    """The (hidden, vocab) output projection; taken once per decode loop, since XLA:CPU multiplies by a transposed
    embedding about twice as slowly as by a stored (hidden, vocab) matrix."""
    if cfg.tie_word_embeddings:
        return params["text"]["embed"].T.astype(cfg.compute_dtype)
    return params["lm_head"]["kernel"].astype(cfg.compute_dtype)


def decoder_layers(params: Params, cfg: Qwen3VLConfig) -> list[Params]:
    """Each decoder layer's weights as its own arrays, in the compute dtype; taken once per decode loop, since
    slicing a layer out of the stacked weights inside the loop copies it on every step."""
    stacked = params["text"]["layers"]
    return [jax.tree.map(lambda a, i=i: a[i].astype(cfg.compute_dtype), stacked)
            for i in range(cfg.text.num_hidden_layers)]


def group_decode_step(params: Params, cfg: Qwen3VLConfig, layers: list[Params], tokens: jax.Array, step: jax.Array,
                      cache: GroupCache, lm_head: jax.Array) -> tuple[jax.Array, GroupCache]:
    """Feed generated token number `step` of every row; float32 logits (rows, V) for the next one."""
    dtype = cfg.compute_dtype
    rows = tokens.shape[0]
    x = params["text"]["embed"][tokens][:, None].astype(dtype)  # (rows, 1, hidden)
    position = cache["next_position"] + step
    cos, sin = mrope_cos_sin(cfg, jnp.broadcast_to(position[None, :, None], (3, rows, 1)))

    h, gen_k, gen_v = x, list(cache["gen_k"]), list(cache["gen_v"])
    for i, p in enumerate(layers):
        q, k, v = _qkv(cfg, p, h, cos, sin)
        # k, v: (rows, 1, kv, d) -> one position of the (rows, kv, d, T) / (rows, kv, T, d) caches.
        k_new = jnp.transpose(k, (0, 2, 3, 1)).astype(gen_k[i].dtype)
        v_new = jnp.transpose(v, (0, 2, 1, 3)).astype(gen_v[i].dtype)
        gen_k[i] = jax.lax.dynamic_update_slice(gen_k[i], k_new, (0, 0, 0, step))
        gen_v[i] = jax.lax.dynamic_update_slice(gen_v[i], v_new, (0, 0, step, 0))
        attn = _group_attention(q, cache["prompt_k"][i], cache["prompt_v"][i], cache["prompt_valid"], gen_k[i],
                                gen_v[i], step)
        h = _attn_out_and_mlp(cfg, p, h, attn)
    # The model's final norm + lm_head (model._logits), with the projection passed in.
    h = rms_norm(h[:, 0], params["text"]["norm"]["scale"], cfg.text.rms_norm_eps)
    return (h @ lm_head).astype(jnp.float32), {**cache, "gen_k": tuple(gen_k), "gen_v": tuple(gen_v)}
