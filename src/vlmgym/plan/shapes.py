"""What `vlmgym plan` compiles for: the model config, and the trainer's and rollout engine's input shapes.

Inputs are built as small host arrays in exactly the layout the trainer and the rollout engine pass (prompts
left-padded to the engine's length bucket, image patches padded as the learner and the engine pad them, one
image per prompt); only the pixel rows, the one large input, stay abstract. `abstract` turns such a tree into
`jax.ShapeDtypeStruct`s carrying shardings, so nothing is allocated for a real config.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from vlmgym.models.family import QWEN2_5_VL, family_named, family_of
from vlmgym.models.qwen3_vl.base_model import SPECIAL_TOKENS, TinyDims
from vlmgym.models.qwen3_vl.config import Qwen3VLConfig, from_hf_dict, named_config
from vlmgym.plan.model_spec import QWEN2_5, TINY_VOCAB, PlanSpec
from vlmgym.rollout.engine import Buckets, bucketed_patch_layout


def plan_config(name: str, dtype: str = "fp32", param_dtype: str = "fp32",
                tiny: tuple[int, int, int] = (128, 4, TINY_VOCAB)) -> Qwen3VLConfig:
    """A shipped real config (Qwen3-VL '2b', '4b', '8b'; Qwen2.5-VL 'qwen2.5-3b', 'qwen2.5-7b') or the pipeline's tiny
    model ('tiny': `TinyDims.scaled` to `tiny`'s width and layers, with its vocabulary (default: the pipeline's,
    2,048 tokens) whose special tokens come first, as the tiny tokenizer numbers them)."""
    if name.startswith(QWEN2_5):
        return family_named(QWEN2_5_VL).named_config(name[len(QWEN2_5):], dtype, param_dtype)
    if name != "tiny":
        return named_config(name, dtype, param_dtype)
    hidden_size, num_layers, vocab_size = tiny
    d = TinyDims.scaled(hidden_size, num_layers)
    ids = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    text = {"vocab_size": vocab_size, "hidden_size": d.hidden_size, "intermediate_size": d.intermediate_size,
            "num_hidden_layers": d.num_layers, "num_attention_heads": d.num_heads,
            "num_key_value_heads": d.num_kv_heads, "head_dim": d.head_dim, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": d.rope_theta,
                                "mrope_section": list(d.mrope_section), "mrope_interleaved": True}}
    vision = {"depth": d.vision_depth, "hidden_size": d.vision_hidden_size, "num_heads": d.vision_heads,
              "intermediate_size": d.vision_intermediate_size, "out_hidden_size": d.hidden_size,
              "num_position_embeddings": d.num_position_embeddings,
              "deepstack_visual_indexes": list(d.deepstack_visual_indexes)}
    hf = {"model_type": "qwen3_vl", "text_config": text, "vision_config": vision,
          "tie_word_embeddings": d.tie_word_embeddings, "image_token_id": ids["<|image_pad|>"],
          "video_token_id": ids["<|video_pad|>"], "vision_start_token_id": ids["<|vision_start|>"],
          "vision_end_token_id": ids["<|vision_end|>"]}
    return from_hf_dict(hf, dtype, param_dtype)


def spec_config(spec: PlanSpec) -> Qwen3VLConfig:
    """The model config `spec` plans for."""
    return plan_config(spec.config, spec.dtype, spec.param_dtype, spec.tiny)


def image_tokens(cfg: Qwen3VLConfig, image: tuple[int, int]) -> int:
    """Merged image tokens of one (height, width) image."""
    patch = cfg.vision.patch_size
    return (image[0] // patch) * (image[1] // patch) // cfg.vision.merge_unit


def _prompts(cfg: Qwen3VLConfig, spec: PlanSpec, count: int) -> dict[str, Any]:
    """`count` left-padded prompts of spec.seq tokens (one image each), as the processor returns them."""
    n_image = image_tokens(cfg, spec.image)
    if spec.seq < n_image + 3:
        raise ValueError(f"--seq {spec.seq} cannot hold the image's {n_image} tokens and its 2 markers")
    buckets = Buckets()
    length = buckets.fit(buckets.prompt_lengths, spec.seq, "prompt length")
    row = np.zeros(spec.seq, np.int32)
    row[1] = cfg.vision_start_token_id
    row[2:2 + n_image] = cfg.image_token_id
    row[2 + n_image] = cfg.vision_end_token_id
    input_ids = np.zeros((count, length), np.int32)
    input_ids[:, length - spec.seq:] = row
    attention_mask = np.zeros((count, length), np.int32)
    attention_mask[:, length - spec.seq:] = 1
    grid = [1, spec.image[0] // cfg.vision.patch_size, spec.image[1] // cfg.vision.patch_size]
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "position_ids": np.zeros((3, count, length), np.int32),
            "image_grid_thw": np.asarray([grid] * count, np.int32)}


def _pixels(cfg: Qwen3VLConfig, rows: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((rows, cfg.vision.patch_dim), np.float32)


def learner_micro(cfg: Qwen3VLConfig, spec: PlanSpec) -> dict[str, Any]:
    """One micro-batch of the trainer's gradient function (grpo_gradients' or sft_gradients' `micro`), pixel rows
    abstract. GRPO with group > 1 runs each prompt once for its group (the shared-prefix learner), or with
    share_prefix off one prompt copy per completion (Qwen3VLPolicy.build_batch)."""
    rows = spec.micro_rows
    prompts = _prompts(cfg, spec, rows // spec.group if spec.share_prefix else rows)
    grids = prompts.pop("image_grid_thw").astype(np.int64)
    # Qwen3VLLearner._with_patch_layout: patches padded to a multiple of the longest image
    total = int(grids[:, 1:].prod(axis=1).sum())
    inputs = {**prompts, "pixel_values": _pixels(cfg, total),
              "patch_layout": family_of(cfg).patch_layout(cfg, grids, pad_to=total)}
    mask = np.ones((rows, spec.answer), np.float32)
    batch = {"inputs": inputs, "completion_ids": np.zeros((rows, spec.answer), np.int32), "completion_mask": mask}
    if spec.algorithm == "sft":
        return {"batch": batch, "mask": mask}
    return {"batch": batch, "behaviour": np.zeros_like(mask), "advantages": np.zeros(rows, np.float32),
            "mask": mask}


def rollout_prompts(cfg: Qwen3VLConfig, spec: PlanSpec) -> dict[str, Any]:
    """The prompts of one sampling call (train.batch_prompts of them) as the engine's prefill takes them: the
    prompt count padded to its bucket (dummy prompts carry no image), patches to a power of two."""
    buckets = Buckets()
    count = spec.batch // spec.group
    padded = buckets.fit(buckets.num_prompts, count, "prompt count")
    prompts = _prompts(cfg, spec, padded)
    grids = prompts.pop("image_grid_thw")[:count].astype(np.int64)
    pad_to = buckets.patches(int(grids[:, 1:].prod(axis=1).sum()))
    return {**prompts, "pixel_values": _pixels(cfg, pad_to), "patch_layout": bucketed_patch_layout(cfg, grids, pad_to)}


def abstract(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs (with the dtype a jit argument gets: int64 host arrays become int32) and shardings."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, jax.dtypes.canonicalize_dtype(x.dtype), sharding=s), tree,
        shardings)
