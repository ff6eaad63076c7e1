"""The learner forward for sampling groups: each prompt (vision tower + prompt tokens) runs once for its G completions.

`model.token_logprobs` scores B rows of prompt + completion, so a GRPO batch of P prompts x G samples runs every
prompt, image included, G times forward and backward. Here the prompts run once (P rows): their per-layer keys
and values are kept, and the P x G completions run as a second pass whose queries attend to their prompt's keys
and values (shared by the group, never copied) plus their own causal keys and values, joined before one fp32
softmax: the same attention as over the concatenated sequence. Under jax.grad the gradient of every shared
prompt activation is the sum over its group, as in the per-copy batch where each copy gets its share.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.model import (
    NEG_INF,
    _attn_out_and_mlp,
    _cast,
    _decoder,
    _embed,
    _full_mask,
    _last_valid_index,
    _next_position,
    _qkv,
    check_image_tokens,
    encode_inputs,
    final_features,
    mrope_cos_sin,
    picked_logprobs,
    text_position_ids,
)
from vlmgym.models.qwen3_vl.weights import Params


def _group_attention(q: jax.Array, k: jax.Array, v: jax.Array, prompt_k: jax.Array, prompt_v: jax.Array,
                     prompt_valid: jax.Array, self_mask: jax.Array) -> jax.Array:
    """Completion queries over their group's prompt keys plus their own keys.

    q (R, C, Hq, D) and k/v (R, C, Hkv, D) for R = P x G completion rows (a group's rows consecutive);
    prompt_k/v (P, L, Hkv, D); prompt_valid (P, L); self_mask (R, C, C) -> (R, C, Hq*D).
    """
    rows, steps, n_q, d = q.shape
    prompts, length, n_kv, _ = prompt_k.shape
    group, per_kv = rows // prompts, n_q // n_kv
    q = q.reshape(rows, steps, n_kv, per_kv, d)
    prompt_scores = jnp.einsum("pgtkhd,pskd->pgkhts", q.reshape(prompts, group, steps, n_kv, per_kv, d), prompt_k,
                               preferred_element_type=jnp.float32) * (d**-0.5)
    prompt_scores = jnp.where(prompt_valid[:, None, None, None, None, :], prompt_scores, NEG_INF)
    self_scores = jnp.einsum("btkhd,bskd->bkhts", q, k, preferred_element_type=jnp.float32) * (d**-0.5)
    self_scores = jnp.where(self_mask[:, None, None], self_scores, NEG_INF)
    scores = jnp.concatenate([prompt_scores.reshape(rows, n_kv, per_kv, steps, length), self_scores], axis=-1)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    prompt_probs = probs[..., :length].reshape(prompts, group, n_kv, per_kv, steps, length)
    out = jnp.einsum("pgkhts,pskd->pgtkhd", prompt_probs, prompt_v).reshape(rows, steps, n_q * d)
    return out + jnp.einsum("bkhts,bskd->btkhd", probs[..., length:], v).reshape(rows, steps, n_q * d)


def shared_prefix_logprobs(params: Params, cfg: Qwen3VLConfig, inputs: dict[str, Any], completion_ids: jax.Array,
                           completion_mask: jax.Array, remat: bool = False, temperature: float = 1.0,
                           with_features: bool = False, with_entropy: bool = False) -> Any:
    """`model.token_logprobs` for P prompts in `inputs` and P x G completions (rows g*G .. g*G+G-1 follow prompt g).

    Equal to `token_logprobs` on the batch with each prompt repeated G times (tests/rl/test_shared_prefix.py), and
    so are the features `with_features=True` returns beside the log-probs and the entropies of `with_entropy=True`.
    """
    prompt_mask = inputs["attention_mask"].astype(jnp.int32)
    prompt_positions = inputs.get("position_ids")
    if prompt_positions is None:
        prompt_positions = text_position_ids(prompt_mask)
    prompts, rows, steps = prompt_mask.shape[0], completion_ids.shape[0], completion_ids.shape[1]
    if rows % prompts:
        raise ValueError(f"{rows} completions are not a whole number of groups of the batch's {prompts} prompts")
    group = rows // prompts
    image_embeds, deepstack_embeds = encode_inputs(params, cfg, inputs, remat)
    check_image_tokens(cfg, inputs["input_ids"], image_embeds)
    x, visual = _embed(params, cfg, inputs["input_ids"], image_embeds)
    h_prompt, (prompt_k, prompt_v) = _decoder(params, cfg, x, prompt_positions.astype(jnp.int32),
                                              _full_mask(prompt_mask), visual, deepstack_embeds, remat)

    first = jnp.repeat(_next_position(prompt_positions, prompt_mask), group)
    positions = first[:, None] + jnp.arange(steps, dtype=jnp.int32)[None]
    cos, sin = mrope_cos_sin(cfg, jnp.broadcast_to(positions[None], (3, rows, steps)))
    completion_valid = completion_mask.astype(bool)
    self_mask = jnp.tril(jnp.ones((steps, steps), bool))[None] & completion_valid[:, None, :]
    prompt_valid = prompt_mask.astype(bool)
    dtype = x.dtype

    def layer(h: jax.Array, xs: tuple[Params, jax.Array, jax.Array]):
        p, layer_k, layer_v = xs
        p = _cast(p, dtype)
        q, k, v = _qkv(cfg, p, h, cos, sin)
        attn = _group_attention(q, k, v, layer_k, layer_v, prompt_valid, self_mask)
        return _attn_out_and_mlp(cfg, p, h, attn), None

    completions = params["text"]["embed"][completion_ids].astype(dtype)
    h, _ = jax.lax.scan(jax.checkpoint(layer) if remat else layer, completions,
                        (params["text"]["layers"], prompt_k, prompt_v))
    # Token 0 is predicted at the prompt's last attended token (shared by the group), token j at completion j - 1.
    last = h_prompt[jnp.arange(prompts), _last_valid_index(prompt_mask)]
    predictors = jnp.concatenate([jnp.repeat(last, group, axis=0)[:, None], h[:, :-1]], axis=1)
    scored = picked_logprobs(params, cfg, predictors, completion_ids, completion_mask, temperature, with_entropy)
    return (scored, final_features(params, cfg, predictors)) if with_features else scored


jit_shared_prefix_logprobs = jax.jit(shared_prefix_logprobs, static_argnums=1,
                                     static_argnames=("remat", "temperature", "with_features", "with_entropy"))
