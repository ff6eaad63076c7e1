"""Parameter layout of the JAX Qwen3-VL: shapes, logical axis names, random init and counts.

Parameters are a nested dict of arrays. Per-layer weights are stacked along a leading
axis ("layers" / "vision_layers" / "deepstack") so the towers run as `lax.scan`s that
compile once per tower instead of once per layer. Every dense kernel is (in, out).
`param_axes(cfg)` gives the parallel tree of logical axis-name tuples that
`sharding.py` maps onto a device mesh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.models.qwen3_vl.config import Qwen3VLConfig

Params = dict[str, Any]


@dataclass(frozen=True)
class ParamSpec:
    """Shape, logical axis names and initialiser kind ('normal', 'ones', 'zeros') of one parameter."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    init: str = "normal"


def _dense(n_in: int, n_out: int, axes: tuple[str, str], bias: bool, stack: tuple[int, str] | None = None):
    lead_shape, lead_axes = ((stack[0],), (stack[1],)) if stack else ((), ())
    out = {"kernel": ParamSpec(lead_shape + (n_in, n_out), lead_axes + axes)}
    if bias:
        out["bias"] = ParamSpec(lead_shape + (n_out,), lead_axes + (axes[1],), "zeros")
    return out


def _layer_norm(dim: int, axis: str, stack: tuple[int, str] | None = None):
    lead_shape, lead_axes = ((stack[0],), (stack[1],)) if stack else ((), ())
    return {"scale": ParamSpec(lead_shape + (dim,), lead_axes + (axis,), "ones"),
            "bias": ParamSpec(lead_shape + (dim,), lead_axes + (axis,), "zeros")}


def param_specs(cfg: Qwen3VLConfig) -> Params:
    """The tree of ParamSpec describing every parameter."""
    t, v = cfg.text, cfg.vision
    vd, merged = v.hidden_size, v.hidden_size * v.merge_unit
    blocks = (v.depth, "vision_layers")
    visual = {
        "patch_embed": _dense(v.patch_dim, vd, ("patch", "vision_embed"), bias=True),
        "pos_embed": ParamSpec((v.num_position_embeddings, vd), ("vision_positions", "vision_embed")),
        "blocks": {
            "norm1": _layer_norm(vd, "vision_embed", blocks),
            "qkv": _dense(vd, 3 * vd, ("vision_embed", "vision_qkv"), True, blocks),
            "proj": _dense(vd, vd, ("vision_heads", "vision_embed"), True, blocks),
            "norm2": _layer_norm(vd, "vision_embed", blocks),
            "fc1": _dense(vd, v.intermediate_size, ("vision_embed", "vision_mlp"), True, blocks),
            "fc2": _dense(v.intermediate_size, vd, ("vision_mlp", "vision_embed"), True, blocks),
        },
        "merger": {
            "norm": _layer_norm(vd, "vision_embed"),
            "fc1": _dense(merged, merged, ("merger_in", "merger_mlp"), True),
            "fc2": _dense(merged, v.out_hidden_size, ("merger_mlp", "embed"), True),
        },
    }
    n_taps = len(v.deepstack_visual_indexes)
    if n_taps:
        taps = (n_taps, "deepstack")
        visual["deepstack"] = {
            "norm": _layer_norm(merged, "merger_in", taps),
            "fc1": _dense(merged, merged, ("merger_in", "merger_mlp"), True, taps),
            "fc2": _dense(merged, v.out_hidden_size, ("merger_mlp", "embed"), True, taps),
        }
    layers = (t.num_hidden_layers, "layers")
    q_dim, kv_dim = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    text = {
        "embed": ParamSpec((t.vocab_size, t.hidden_size), ("vocab", "embed")),
        "layers": {
            "input_norm": {"scale": ParamSpec((t.num_hidden_layers, t.hidden_size), ("layers", "norm"), "ones")},
            "q": _dense(t.hidden_size, q_dim, ("embed", "q_heads"), False, layers),
            "k": _dense(t.hidden_size, kv_dim, ("embed", "kv_heads"), False, layers),
            "v": _dense(t.hidden_size, kv_dim, ("embed", "kv_heads"), False, layers),
            "o": _dense(q_dim, t.hidden_size, ("q_heads", "embed"), False, layers),
            "q_norm": {"scale": ParamSpec((t.num_hidden_layers, t.head_dim), ("layers", "head_dim"), "ones")},
            "k_norm": {"scale": ParamSpec((t.num_hidden_layers, t.head_dim), ("layers", "head_dim"), "ones")},
            "post_norm": {"scale": ParamSpec((t.num_hidden_layers, t.hidden_size), ("layers", "norm"), "ones")},
            "gate": _dense(t.hidden_size, t.intermediate_size, ("embed", "mlp"), False, layers),
            "up": _dense(t.hidden_size, t.intermediate_size, ("embed", "mlp"), False, layers),
            "down": _dense(t.intermediate_size, t.hidden_size, ("mlp", "embed"), False, layers),
        },
        "norm": {"scale": ParamSpec((t.hidden_size,), ("norm",), "ones")},
    }
    specs: Params = {"visual": visual, "text": text}
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = {"kernel": ParamSpec((t.hidden_size, t.vocab_size), ("embed", "vocab"))}
    return specs


def _is_spec(x: Any) -> bool:
    return isinstance(x, ParamSpec)


def param_axes(cfg: Qwen3VLConfig) -> Params:
    """The tree of logical axis-name tuples, parallel to the params tree."""
    return jax.tree.map(lambda s: s.axes, param_specs(cfg), is_leaf=_is_spec)


def abstract_params(cfg: Qwen3VLConfig) -> Params:
    """ShapeDtypeStructs of every parameter (no memory), via jax.eval_shape of the initialiser."""
    return jax.eval_shape(lambda key: init_params(cfg, key), jax.random.key(0))


def init_params(cfg: Qwen3VLConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random parameters (normal(std) matrices, unit norm scales, zero biases) in cfg.param_dtype."""
    return init_from_specs(param_specs(cfg), key, cfg.params_dtype, std)


def init_from_specs(specs: Params, key: jax.Array, dtype: Any, std: float = 0.02) -> Params:
    """Random parameters of a ParamSpec tree (shared by the model families)."""
    leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
    keys = jax.random.split(key, len(leaves))

    def make(spec: ParamSpec, k: jax.Array) -> jax.Array:
        if spec.init == "ones":
            return jnp.ones(spec.shape, dtype)
        if spec.init == "zeros":
            return jnp.zeros(spec.shape, dtype)
        return (std * jax.random.normal(k, spec.shape, jnp.float32)).astype(dtype)

    return jax.tree.unflatten(treedef, [make(s, k) for s, k in zip(leaves, keys)])


def count_params(tree: Params) -> int:
    """Number of scalars in a params (or abstract params) tree."""
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(tree)))


def cast_params(tree: Params, dtype: Any) -> Params:
    """Every parameter cast to `dtype`."""
    return jax.tree.map(lambda x: x.astype(dtype) if isinstance(x, jax.Array) else np.asarray(x).astype(dtype), tree)
