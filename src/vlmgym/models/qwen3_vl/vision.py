"""Qwen3-VL vision tower: patch embed, interpolated learned positions, 2-D rotary ViT blocks, DeepStack, merger.

Everything that depends on the image grids (interpolation taps, rotary coordinates,
which image each patch belongs to) is computed on the host in numpy by
`patch_layout`, so the jitted tower only sees arrays whose shapes follow the
number of patches: new grid sizes with the same patch count reuse the compile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.lora import adapter_input
from vlmgym.models.qwen3_vl.weights import Params

PatchLayout = dict[str, Any]


def _grid_rows_cols(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of each patch of an h x w grid, listed in merge-block order (as the processor emits them)."""
    within = np.arange(h * w)
    blocks_w = w // merge
    in_col = within % merge
    in_row = (within // merge) % merge
    block_col = (within // (merge * merge)) % blocks_w
    block_row = within // (merge * merge * blocks_w)
    return block_row * merge + in_row, block_col * merge + in_col


def _bilinear_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Two taps and weights per target position: F.interpolate(bilinear, align_corners=True), in float32."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    weights = np.maximum(np.float32(1) - np.abs(src[:, None] - floor[:, None] - offsets), 0).astype(np.float32)
    return taps, weights


def patch_layout(cfg: Qwen3VLConfig, grid_thw: Sequence[Sequence[int]], pad_to: int | None = None) -> PatchLayout:
    """Host-side per-patch arrays for `encode_patches`: position taps, rotary coordinates, attention blocks.

    Attention is block-diagonal (each image frame attends to itself only), so patches are gathered into
    `block_index` (frames, longest frame) for attention and put back with `patch_slot`: the cost grows with
    the sum of squared frame sizes, not with the square of all patches. `pad_to` pads the patch axis (e.g. to
    a bucket); padded patches form their own blocks and their outputs are never used because image features
    are consumed in order.
    """
    v = cfg.vision
    side, merge = v.grid_side, v.spatial_merge_size
    pos_index, pos_weight, rows_cols, lengths = [], [], [], []
    for t, h, w in (tuple(int(x) for x in g) for g in grid_thw):
        if h % merge or w % merge:
            raise ValueError(f"grid {t}x{h}x{w} is not divisible by the merge size {merge}")
        row, col = _grid_rows_cols(h, w, merge)
        h_taps, h_weights = _bilinear_taps(row, h, side)
        w_taps, w_weights = _bilinear_taps(col, w, side)
        index = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
        weight = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)
        for _ in range(t):  # each frame attends only to itself
            pos_index.append(index)
            pos_weight.append(weight)
            rows_cols.append(np.stack([row, col], axis=-1))
            lengths.append(h * w)
    n = sum(lengths)
    if pad_to is not None and pad_to > n:
        if (pad_to - n) % v.merge_unit:
            raise ValueError(f"pad_to - patches ({pad_to - n}) must be a multiple of {v.merge_unit}")
        pad = pad_to - n
        pos_index.append(np.zeros((pad, 4), np.int64))
        pos_weight.append(np.zeros((pad, 4), np.float32))
        rows_cols.append(np.zeros((pad, 2), np.int64))
        # Padding is split into blocks no longer than the longest frame: one long padding block would widen
        # every row of `block_index` and make the attention cost grow with the square of the padding.
        chunk = max(lengths, default=pad)
        lengths.extend([chunk] * (pad // chunk) + ([pad % chunk] if pad % chunk else []))
    longest = max(lengths)
    block_index = np.full((len(lengths), longest), sum(lengths), np.int32)  # past-the-end: a zero row
    patch_slot = np.zeros(sum(lengths), np.int32)
    start = 0
    for block, length in enumerate(lengths):
        block_index[block, :length] = np.arange(start, start + length)
        patch_slot[start:start + length] = block * longest + np.arange(length)
        start += length
    return {
        "pos_index": np.concatenate(pos_index).astype(np.int32),
        "pos_weight": np.concatenate(pos_weight).astype(np.float32),
        "rotary_pos": np.concatenate(rows_cols).astype(np.int32),
        "block_index": block_index,
        "block_valid": block_index < sum(lengths),
        "patch_slot": patch_slot,
    }


def _layer_norm(x: jax.Array, p: Params, eps: float = 1e-6) -> jax.Array:
    """LayerNorm computed in fp32, returned in the input dtype."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    return (y * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)).astype(x.dtype)


def _dense(x: jax.Array, p: Params) -> jax.Array:
    y = x @ p["kernel"].astype(x.dtype)
    if "lora_a" in p:  # a LoRA adapter (vlmgym.models.qwen3_vl.lora)
        a, b, scale = (p[k].astype(x.dtype) for k in ("lora_a", "lora_b", "lora_scale"))
        y = y + ((adapter_input(x, p) @ a) @ b) * scale
    return y + p["bias"].astype(x.dtype) if "bias" in p else y


def _rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rotary_cos_sin(cfg: Qwen3VLConfig, rotary_pos: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos/sin (N, head_dim) of the axial 2-D rope: the first half rotates with rows, the second with columns."""
    spatial_dim = cfg.vision.head_dim // 2
    inv_freq = 1.0 / (cfg.vision.rope_theta ** (np.arange(0, spatial_dim, 2, dtype=np.float32) / spatial_dim))
    freqs = rotary_pos.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)  # (N, 2, hd/4)
    freqs = freqs.reshape(freqs.shape[0], -1)
    freqs = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(freqs), jnp.sin(freqs)


def block_attention(cfg: Any, p: Params, h: jax.Array, cos: jax.Array, sin: jax.Array, block_index: jax.Array,
                    block_valid: jax.Array, patch_slot: jax.Array) -> jax.Array:
    """Fused qkv, 2-D rotary (fp32), non-causal attention inside each block of patches, then `proj`.

    `block_index` (blocks, longest) lists the patches of each block (past-the-end = a zero row), `block_valid`
    marks the real ones, `patch_slot` puts each patch's output back in patch order. Blocks are image frames
    (Qwen3-VL, Qwen2.5-VL full-attention blocks) or attention windows (Qwen2.5-VL).
    """
    v = cfg.vision
    n = h.shape[0]
    qkv = _dense(h, p["qkv"]).reshape(n, 3, v.num_heads, v.head_dim)
    q, k, val = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    # Rotary in fp32 as transformers does, then back to the compute dtype.
    c, s = cos[:, None, :], sin[:, None, :]
    q = (q.astype(jnp.float32) * c + _rotate_half(q.astype(jnp.float32)) * s).astype(h.dtype)
    k = (k.astype(jnp.float32) * c + _rotate_half(k.astype(jnp.float32)) * s).astype(h.dtype)

    def blocks(t: jax.Array) -> jax.Array:  # (N, heads, D) -> (blocks, longest, heads, D)
        return jnp.concatenate([t, jnp.zeros((1,) + t.shape[1:], t.dtype)])[block_index]

    scores = jnp.einsum("bqhd,bkhd->bhqk", blocks(q), blocks(k), preferred_element_type=jnp.float32)
    scores = scores * (v.head_dim**-0.5)
    scores = jnp.where(block_valid[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(h.dtype)
    attn = jnp.einsum("bhqk,bkhd->bqhd", probs, blocks(val)).reshape(-1, v.hidden_size)[patch_slot]
    return _dense(attn, p["proj"])


def _block(cfg: Qwen3VLConfig, p: Params, x: jax.Array, cos: jax.Array, sin: jax.Array,
           layout: PatchLayout) -> jax.Array:
    """One pre-norm ViT block with attention restricted to patches of the same image frame."""
    x = x + block_attention(cfg, p, _layer_norm(x, p["norm1"]), cos, sin, layout["block_index"],
                            layout["block_valid"], layout["patch_slot"])
    hidden = _dense(_layer_norm(x, p["norm2"]), p["fc1"])
    hidden = jax.nn.gelu(hidden, approximate=cfg.vision.hidden_act == "gelu_pytorch_tanh")
    return x + _dense(hidden, p["fc2"])


def _merge(cfg: Qwen3VLConfig, p: Params, x: jax.Array, norm_after_grouping: bool) -> jax.Array:
    """Group 2x2 neighbouring patches and project to the text hidden size (exact GELU)."""
    grouped = x.shape[-1] * cfg.vision.merge_unit
    if norm_after_grouping:  # DeepStack mergers ("post-shuffle norm")
        x = _layer_norm(x.reshape(-1, grouped), p["norm"])
    else:  # final merger ("pre-shuffle norm")
        x = _layer_norm(x, p["norm"]).reshape(-1, grouped)
    return _dense(jax.nn.gelu(_dense(x, p["fc1"]), approximate=False), p["fc2"])


def encode_patches(params: Params, cfg: Qwen3VLConfig, pixel_values: jax.Array,
                   layout: PatchLayout, remat: bool = False) -> tuple[jax.Array, jax.Array]:
    """Vision tower on (N, patch_dim) pixel rows -> (N/4, hidden) image embeds and (taps, N/4, hidden) DeepStack.

    `remat` recomputes each block's activations in the backward pass (jax.checkpoint) to save memory.
    """
    v, dtype = cfg.vision, cfg.compute_dtype
    p = params["visual"]
    x = _dense(pixel_values.astype(dtype), p["patch_embed"])
    table = p["pos_embed"][layout["pos_index"]]  # (N, 4, D)
    pos = (table.astype(jnp.float32) * layout["pos_weight"][..., None]).sum(1)
    x = x + pos.astype(dtype)
    cos, sin = _rotary_cos_sin(cfg, layout["rotary_pos"])

    def body(h: jax.Array, block: Params) -> tuple[jax.Array, None]:
        return _block(cfg, block, h, cos, sin, layout), None

    body = jax.checkpoint(body) if remat else body

    deepstack = []
    start = 0
    # One scan per stretch of blocks between DeepStack taps (a Python loop over <= 4 stretches).
    for tap, end in enumerate(v.deepstack_visual_indexes):
        stretch = jax.tree.map(lambda a, s=start, e=end: a[s:e + 1], p["blocks"])
        x, _ = jax.lax.scan(body, x, stretch)
        merger = jax.tree.map(lambda a, i=tap: a[i], p["deepstack"])
        deepstack.append(_merge(cfg, merger, x, norm_after_grouping=True))
        start = end + 1
    if start < v.depth:
        x, _ = jax.lax.scan(body, x, jax.tree.map(lambda a: a[start:], p["blocks"]))
    image_embeds = _merge(cfg, p["merger"], x, norm_after_grouping=False)
    if deepstack:
        stacked = jnp.stack(deepstack)
    else:
        stacked = jnp.zeros((0,) + image_embeds.shape, image_embeds.dtype)
    return image_embeds, stacked


def encode_images(params: Params, cfg: Qwen3VLConfig, pixel_values: jax.Array,
                  grid_thw: Sequence[Sequence[int]]) -> tuple[jax.Array, jax.Array]:
    """Host wrapper: image embeds (sum(t*h*w)/4, hidden) and DeepStack embeds (taps, same, hidden)."""
    layout = patch_layout(cfg, grid_thw)
    if pixel_values.shape[0] != len(layout["patch_slot"]):
        raise ValueError(f"pixel_values has {pixel_values.shape[0]} rows, grid_thw {list(grid_thw)} needs "
                         f"{len(layout['patch_slot'])}")
    return _encode_patches_jit(params, cfg, pixel_values, layout)


_encode_patches_jit = jax.jit(encode_patches, static_argnums=1)
