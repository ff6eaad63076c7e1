"""Qwen2.5-VL vision tower: patch embed (no bias), 2-D rotary ViT blocks with RMSNorm and a SwiGLU MLP, window
attention except in the `fullatt_block_indexes` blocks, and an RMSNorm 2x2 patch merger.

transformers permutes the patches into window order (`get_vision_window_index`), runs the blocks on
contiguous windows / frames, merges, and permutes the merged tokens back. Attention, rotary, RMSNorm and MLP
act on each patch or inside a group, and the permutation moves whole 2x2 merge units, so the same result comes
from attention restricted to each patch's window (or frame) in the processor's patch order, without
permuting: `patch_layout` gathers each window's patches, listed in transformers' window order, into blocks of
`block_attention` (shared with Qwen3-VL). Everything that depends on the grids is host-side numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from vlmgym.models.qwen2_5_vl.config import Qwen25VLConfig
from vlmgym.models.qwen3_vl.layers import rms_norm
from vlmgym.models.qwen3_vl.vision import _dense, _grid_rows_cols, _rotary_cos_sin, block_attention
from vlmgym.models.qwen3_vl.weights import Params

PatchLayout = dict[str, Any]
VISION_EPS = 1e-6  # transformers hard-codes the vision RMSNorm eps
_ACTIVATIONS = {"silu": jax.nn.silu, "swish": jax.nn.silu, "gelu": lambda x: jax.nn.gelu(x, approximate=False),
                "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


def window_groups(grid_t: int, grid_h: int, grid_w: int, merge: int, window: int) -> list[np.ndarray]:
    """Merge-unit indices (within one image, frame-major) of each attention window, in transformers' order.

    Windows tile each frame's merged (h/merge x w/merge) grid in `window` x `window` squares, row-major, the last
    ones cut at the edge; inside a window, units are row-major. Equals `get_vision_window_index` split at its
    `cu_window_seqlens`.
    """
    rows, cols = grid_h // merge, grid_w // merge
    groups = []
    for t in range(grid_t):
        unit = np.arange(rows * cols).reshape(rows, cols) + t * rows * cols
        for r in range(0, rows, window):
            for c in range(0, cols, window):
                groups.append(unit[r:r + window, c:c + window].reshape(-1))
    return groups


def _blocks(groups: list[np.ndarray], total: int) -> dict[str, np.ndarray]:
    """block_index / block_valid / patch_slot for attention inside each group of patch indices."""
    longest = max(len(g) for g in groups)
    block_index = np.full((len(groups), longest), total, np.int32)  # past-the-end: a zero row
    patch_slot = np.full(total, -1, np.int64)
    for block, group in enumerate(groups):
        block_index[block, :len(group)] = group
        patch_slot[group] = block * longest + np.arange(len(group))
    if (patch_slot < 0).any():
        raise AssertionError("attention groups do not cover every patch")
    return {"index": block_index, "valid": block_index < total, "slot": patch_slot.astype(np.int32)}


def patch_layout(cfg: Qwen25VLConfig, grid_thw: Sequence[Sequence[int]], pad_to: int | None = None) -> PatchLayout:
    """Host-side per-patch arrays for `encode_patches`: rotary coordinates, frame blocks and window blocks.

    `pad_to` pads the patch axis (e.g. to a bucket); padded patches form their own blocks (no longer than the
    longest real one) and their outputs are never used because image features are consumed in order.
    """
    v = cfg.vision
    merge, unit = v.spatial_merge_size, v.merge_unit
    frames: list[np.ndarray] = []
    windows: list[np.ndarray] = []
    rows_cols = []
    start = 0
    for t, h, w in (tuple(int(x) for x in g) for g in grid_thw):
        if h % merge or w % merge:
            raise ValueError(f"grid {t}x{h}x{w} is not divisible by the merge size {merge}")
        row, col = _grid_rows_cols(h, w, merge)
        for f in range(t):
            frames.append(start + f * h * w + np.arange(h * w))
            rows_cols.append(np.stack([row, col], axis=-1))
        for group in window_groups(t, h, w, merge, v.window_merged):
            windows.append(start + (group[:, None] * unit + np.arange(unit)).reshape(-1))
        start += t * h * w
    n = start
    if pad_to is not None and pad_to > n:
        if (pad_to - n) % unit:
            raise ValueError(f"pad_to - patches ({pad_to - n}) must be a multiple of {unit}")
        rows_cols.append(np.zeros((pad_to - n, 2), np.int64))
        for groups in (frames, windows):
            chunk = max(len(g) for g in groups)
            groups.extend(np.arange(s, min(s + chunk, pad_to)) for s in range(n, pad_to, chunk))
        n = pad_to
    full, win = _blocks(frames, n), _blocks(windows, n)
    return {"rotary_pos": np.concatenate(rows_cols).astype(np.int32),
            "full_index": full["index"], "full_valid": full["valid"], "full_slot": full["slot"],
            "window_index": win["index"], "window_valid": win["valid"], "window_slot": win["slot"]}


def _block(cfg: Qwen25VLConfig, p: Params, x: jax.Array, cos: jax.Array, sin: jax.Array, layout: PatchLayout,
           kind: str) -> jax.Array:
    """One pre-RMSNorm ViT block; attention inside each frame (kind 'full') or window (kind 'window')."""
    h = rms_norm(x, p["norm1"]["scale"], VISION_EPS)
    x = x + block_attention(cfg, p, h, cos, sin, layout[f"{kind}_index"], layout[f"{kind}_valid"],
                            layout[f"{kind}_slot"])
    h = rms_norm(x, p["norm2"]["scale"], VISION_EPS)
    act = _ACTIVATIONS[cfg.vision.hidden_act]
    return x + _dense(act(_dense(h, p["gate"])) * _dense(h, p["up"]), p["down"])


def _stretches(cfg: Qwen25VLConfig) -> list[tuple[int, int, str]]:
    """(start, end, kind) runs of consecutive blocks with the same attention kind."""
    full = set(cfg.vision.fullatt_block_indexes)
    runs: list[tuple[int, int, str]] = []
    for i in range(cfg.vision.depth):
        kind = "full" if i in full else "window"
        if runs and runs[-1][2] == kind:
            runs[-1] = (runs[-1][0], i + 1, kind)
        else:
            runs.append((i, i + 1, kind))
    return runs


def encode_patches(params: Params, cfg: Qwen25VLConfig, pixel_values: jax.Array, layout: PatchLayout,
                   remat: bool = False) -> jax.Array:
    """Vision tower on (N, patch_dim) pixel rows in processor order -> (N/4, text hidden) image embeds."""
    dtype = cfg.compute_dtype
    p = params["visual"]
    x = _dense(pixel_values.astype(dtype), p["patch_embed"])
    cos, sin = _rotary_cos_sin(cfg, layout["rotary_pos"])
    for start, end, kind in _stretches(cfg):  # one scan per run of window / full-attention blocks

        def body(h: jax.Array, block: Params, kind: str = kind) -> tuple[jax.Array, None]:
            return _block(cfg, block, h, cos, sin, layout, kind), None

        body = jax.checkpoint(body) if remat else body
        x, _ = jax.lax.scan(body, x, jax.tree.map(lambda a, s=start, e=end: a[s:e], p["blocks"]))
    merger = p["merger"]
    grouped = rms_norm(x, merger["norm"]["scale"], VISION_EPS).reshape(-1, x.shape[-1] * cfg.vision.merge_unit)
    return _dense(jax.nn.gelu(_dense(grouped, merger["fc1"]), approximate=False), merger["fc2"])


def encode_images(params: Params, cfg: Qwen25VLConfig, pixel_values: jax.Array,
                  grid_thw: Sequence[Sequence[int]]) -> jax.Array:
    """Host wrapper: image embeds (sum(t*h*w)/4, text hidden) in processor order."""
    layout = patch_layout(cfg, grid_thw)
    if pixel_values.shape[0] != len(layout["full_slot"]):
        raise ValueError(f"pixel_values has {pixel_values.shape[0]} rows, grid_thw {list(grid_thw)} needs "
                         f"{len(layout['full_slot'])}")
    return _encode_patches_jit(params, cfg, pixel_values, layout)


_encode_patches_jit = jax.jit(encode_patches, static_argnums=1)
