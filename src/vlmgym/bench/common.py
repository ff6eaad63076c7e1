"""Shared pieces of the rollout benchmark: prompts, FLOP and byte counts, the matmul roofline, memory."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.rollout.sampling import SamplingSettings


def build_default_model(folder: Path) -> Path:
    """The pipeline's tiny default Qwen3-VL (default `model` params: tokenizer trained on the envs' text)."""
    # here, not at the top: the builder imports JAX and transformers, which `vlmgym bench ... --help` never needs
    from vlmgym.envs import corpus
    from vlmgym.models.qwen3_vl.base_model import build_base_model
    from vlmgym.params import ModelParams, from_dict

    build_base_model(from_dict(ModelParams, {"hf_dir": str(folder)}), corpus=corpus())
    return folder


def synthetic_obs(num_prompts: int, seed: int = 0, width: int = 256, height: int = 192) -> list[dict[str, Any]]:
    """geospot-style observations: one image of the shards' size and the geospot question."""
    from vlmgym.envs.geospot import PROMPT

    rng = np.random.default_rng(seed)
    obs = []
    for _ in range(num_prompts):
        # Smooth random colour fields (a coarse grid upsampled), so resizing behaves as on photos.
        coarse = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BILINEAR)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
        obs.append({"images": [image], "messages": messages})
    return obs


def synthetic_token_inputs(cfg: Qwen3VLConfig, num_prompts: int, image_size: tuple[int, int] = (256, 256),
                           text_tokens: int = 48, seed: int = 0) -> dict[str, np.ndarray]:
    """Model inputs without a tokenizer (random text ids around one image), for random-weight real configs."""
    from vlmgym.models.qwen3_vl.processor import ImageSettings, get_rope_index, preprocess_images

    rng = np.random.default_rng(seed)
    settings = ImageSettings(min_pixels=image_size[0] * image_size[1], max_pixels=image_size[0] * image_size[1])
    images = [np.asarray(synthetic_obs(1, seed + i, image_size[1], image_size[0])[0]["images"][0])
              for i in range(num_prompts)]
    pixel_values, grid_thw = preprocess_images(images, settings=settings)
    special = {cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id}
    rows = []
    for index in range(num_prompts):
        n_image = int(grid_thw[index].prod()) // cfg.vision.merge_unit
        before = [int(t) for t in rng.integers(0, cfg.text.vocab_size, size=4) if int(t) not in special]
        after = [int(t) for t in rng.integers(0, cfg.text.vocab_size, size=text_tokens) if int(t) not in special]
        rows.append(before + [cfg.vision_start_token_id] + [cfg.image_token_id] * n_image
                    + [cfg.vision_end_token_id] + after)
    from vlmgym.rollout.engine import Buckets

    buckets = Buckets()
    length = buckets.fit(buckets.prompt_lengths, max(len(r) for r in rows), "prompt length")
    input_ids = np.zeros((num_prompts, length), np.int32)
    attention_mask = np.zeros((num_prompts, length), np.int32)
    for index, row in enumerate(rows):
        input_ids[index, length - len(row):] = row
        attention_mask[index, length - len(row):] = 1
    position_ids, rope_deltas = get_rope_index(input_ids, grid_thw, attention_mask, image_token_id=cfg.image_token_id,
                                               spatial_merge_size=cfg.vision.spatial_merge_size)
    mm = ((input_ids == cfg.image_token_id) & (attention_mask == 1)).astype(np.int32)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "mm_token_type_ids": mm,
            "pixel_values": pixel_values, "image_grid_thw": grid_thw, "position_ids": position_ids,
            "rope_deltas": rope_deltas, "prompt_lengths": attention_mask.sum(1).astype(np.int32)}


def decode_flops_per_token(cfg: Qwen3VLConfig, context: float) -> float:
    """Model FLOPs of one decoded token: 2 x (decoder matmul weights + lm_head) + attention over `context`."""
    t = cfg.text
    q_dim, kv_dim = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    per_layer = t.hidden_size * (2 * q_dim + 2 * kv_dim) + 3 * t.hidden_size * t.intermediate_size
    matmul_weights = t.num_hidden_layers * per_layer + t.hidden_size * t.vocab_size
    # Scores and weighted values: 2 matmuls of q_dim x context per layer, 2 FLOPs per multiply-add.
    attention = t.num_hidden_layers * 2 * 2 * q_dim * context
    return 2.0 * matmul_weights + attention


def decode_bytes_per_step(cfg: Qwen3VLConfig, batch: int, context: float, param_bytes: int, cache_bytes: int) -> float:
    """Bytes one decode step must read at least: the decoder + lm_head weights once, and the batch's KV cache."""
    t = cfg.text
    q_dim, kv_dim = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    per_layer = t.hidden_size * (2 * q_dim + 2 * kv_dim) + 3 * t.hidden_size * t.intermediate_size + 4 * t.hidden_size
    weights = t.num_hidden_layers * per_layer + t.hidden_size * t.vocab_size
    kv = t.num_hidden_layers * 2 * kv_dim * context * batch
    return weights * param_bytes + kv * cache_bytes


def measure_matmul_flops(m: int, k: int, n: int, dtype: str = "fp32", repeats: int = 10) -> dict[str, float]:
    """FLOP/s of (m, k) @ (k, n) matmuls (n >= k) on the default JAX device: best and median of `repeats`.

    Each timing chains x <- (x @ w) @ w.T inside one jitted loop, so every product depends on the previous
    one (nothing can be hoisted) and dispatch overhead does not count; w has orthonormal rows, so x keeps its
    norm (no overflow, no denormals).
    """
    import jax
    import jax.numpy as jnp

    if n < k:
        raise ValueError(f"measure_matmul_flops needs n >= k, got k={k} n={n}")
    jdtype = {"fp32": jnp.float32, "bf16": jnp.bfloat16}[dtype]
    rng = np.random.default_rng(0)
    w = np.linalg.qr(rng.standard_normal((n, n)))[0][:k].astype(np.float32)
    x = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32), jdtype)
    w, w_t = jnp.asarray(w, jdtype), jnp.asarray(w.T.copy(), jdtype)
    inner = max(1, int(4e9 // (4 * m * k * n)))
    chain = jax.jit(lambda x0: jax.lax.fori_loop(0, inner, lambda i, h: (h @ w) @ w_t, x0))
    chain(x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        chain(x).block_until_ready()
        times.append(time.perf_counter() - start)
    flops = 4.0 * m * k * n * inner
    return {"best": flops / min(times), "median": flops / float(np.median(times))}


def measure_numpy_matmul_flops(size: int = 2048, repeats: int = 10) -> float:
    """Best FLOP/s of a square fp32 numpy (BLAS) matmul, for comparison with JAX's."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def peak_memory_bytes(backend: str | None = None) -> int:
    """Peak memory of this process: accelerator peak for 'jax' / 'torch' on a GPU, else peak resident set size."""
    if backend == "torch":
        import torch

        return int(torch.cuda.max_memory_allocated())
    if backend == "jax":
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            return int(stats["peak_bytes_in_use"])
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def sampling_from_args(args: dict[str, Any]) -> SamplingSettings:
    """The throughput-run sampling settings shared by both sides (no EOS: every sequence runs full length)."""
    return SamplingSettings(max_new_tokens=int(args["max_new_tokens"]), temperature=float(args["temperature"]),
                            top_k=int(args["top_k"]), top_p=float(args["top_p"]), eos_ids=(),
                            pad_id=int(args["pad_id"]))
