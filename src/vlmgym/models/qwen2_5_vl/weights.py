"""Parameter layout of the JAX Qwen2.5-VL (the Qwen3-VL layout's conventions: stacked layers, (in, out) kernels).

Differences from Qwen3-VL: the vision tower has RMSNorms (scale only), a bias-free patch embed, no learned
position table, a gated MLP (gate / up / down with biases) and no DeepStack mergers; the text decoder has q/k/v
biases and no q/k norms.
"""

from __future__ import annotations

from typing import Any

import jax

from vlmgym.models.qwen2_5_vl.config import Qwen25VLConfig
from vlmgym.models.qwen3_vl.weights import Params, ParamSpec, _dense, init_from_specs


def _norm(dim: int, axis: str, stack: tuple[int, str] | None = None) -> Params:
    lead_shape, lead_axes = ((stack[0],), (stack[1],)) if stack else ((), ())
    return {"scale": ParamSpec(lead_shape + (dim,), lead_axes + (axis,), "ones")}


def param_specs(cfg: Qwen25VLConfig) -> Params:
    """The tree of ParamSpec describing every parameter."""
    t, v = cfg.text, cfg.vision
    vd, merged = v.hidden_size, v.hidden_size * v.merge_unit
    blocks = (v.depth, "vision_layers")
    visual = {
        "patch_embed": _dense(v.patch_dim, vd, ("patch", "vision_embed"), bias=False),
        "blocks": {
            "norm1": _norm(vd, "vision_embed", blocks),
            "qkv": _dense(vd, 3 * vd, ("vision_embed", "vision_qkv"), True, blocks),
            "proj": _dense(vd, vd, ("vision_heads", "vision_embed"), True, blocks),
            "norm2": _norm(vd, "vision_embed", blocks),
            "gate": _dense(vd, v.intermediate_size, ("vision_embed", "vision_mlp"), True, blocks),
            "up": _dense(vd, v.intermediate_size, ("vision_embed", "vision_mlp"), True, blocks),
            "down": _dense(v.intermediate_size, vd, ("vision_mlp", "vision_embed"), True, blocks),
        },
        "merger": {
            "norm": _norm(vd, "vision_embed"),
            "fc1": _dense(merged, merged, ("merger_in", "merger_mlp"), True),
            "fc2": _dense(merged, v.out_hidden_size, ("merger_mlp", "embed"), True),
        },
    }
    layers = (t.num_hidden_layers, "layers")
    q_dim, kv_dim = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    text = {
        "embed": ParamSpec((t.vocab_size, t.hidden_size), ("vocab", "embed")),
        "layers": {
            "input_norm": _norm(t.hidden_size, "norm", layers),
            "q": _dense(t.hidden_size, q_dim, ("embed", "q_heads"), True, layers),
            "k": _dense(t.hidden_size, kv_dim, ("embed", "kv_heads"), True, layers),
            "v": _dense(t.hidden_size, kv_dim, ("embed", "kv_heads"), True, layers),
            "o": _dense(q_dim, t.hidden_size, ("q_heads", "embed"), False, layers),
            "post_norm": _norm(t.hidden_size, "norm", layers),
            "gate": _dense(t.hidden_size, t.intermediate_size, ("embed", "mlp"), False, layers),
            "up": _dense(t.hidden_size, t.intermediate_size, ("embed", "mlp"), False, layers),
            "down": _dense(t.intermediate_size, t.hidden_size, ("mlp", "embed"), False, layers),
        },
        "norm": _norm(t.hidden_size, "norm"),
    }
    specs: Params = {"visual": visual, "text": text}
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = {"kernel": ParamSpec((t.hidden_size, t.vocab_size), ("embed", "vocab"))}
    return specs


def _is_spec(x: Any) -> bool:
    return isinstance(x, ParamSpec)


def param_axes(cfg: Qwen25VLConfig) -> Params:
    """The tree of logical axis-name tuples, parallel to the params tree."""
    return jax.tree.map(lambda s: s.axes, param_specs(cfg), is_leaf=_is_spec)


def init_params(cfg: Qwen25VLConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random parameters (normal(std) matrices, unit norm scales, zero biases) in cfg.param_dtype."""
    return init_from_specs(param_specs(cfg), key, cfg.params_dtype, std)


def abstract_params(cfg: Qwen25VLConfig) -> Params:
    """ShapeDtypeStructs of every parameter (no memory)."""
    return jax.eval_shape(lambda key: init_params(cfg, key), jax.random.key(0))
