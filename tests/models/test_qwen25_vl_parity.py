"""The JAX Qwen2.5-VL equals transformers' Qwen2_5_VLForConditionalGeneration (fp32 logits within 1e-4), over
configs whose window sizes and full-attention blocks differ from the shipped ones."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from qwen25_fixtures import IMAGE_TOKEN, PATCH, hf_forward, image_prompt, jit_forward, make_batch, make_tiny, rope_index

from vlmgym.models.qwen2_5_vl.vision import encode_images

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
# name: (tied embeddings, full-attention block indexes, window side in merged patches, seed)
CONFIGS = {
    "tied_full0_window2": (True, (0,), 2, 0),
    "untied_full13_window4": (False, (1, 3), 4, 1),
    "untied_nofull_window2": (False, (), 2, 2),
}
MAX_DIFF: dict[str, float] = {}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request, tmp_path_factory):
    tie, fullatt, window, seed = CONFIGS[request.param]
    built = make_tiny(tmp_path_factory.mktemp(request.param), tie, fullatt, window, seed)
    built.name = request.param
    return built


def jax_logits(tiny, batch) -> tuple[np.ndarray, np.ndarray]:
    """JAX logits with JAX's own rope index (and that index, to compare with transformers')."""
    image_embeds = None
    grids = [tuple(int(x) for x in g) for g in batch["grid_thw"]]
    if batch["pixel_values"] is not None:
        image_embeds = encode_images(tiny.params, tiny.cfg, jnp.asarray(batch["pixel_values"]), grids)
    positions, _ = rope_index(tiny.cfg, batch["input_ids"], batch["grid_thw"] if grids else None,
                                     batch["attention_mask"])
    logits = jit_forward(tiny.params, tiny.cfg, jnp.asarray(batch["input_ids"], jnp.int32),
                                jnp.asarray(batch["attention_mask"], jnp.int32), jnp.asarray(positions, jnp.int32),
                                image_embeds)
    return np.asarray(logits), positions


def assert_close(tiny, batch) -> float:
    expected, hf_positions = hf_forward(tiny.hf, batch)
    got, positions = jax_logits(tiny, batch)
    valid = batch["attention_mask"].astype(bool)
    np.testing.assert_array_equal(positions[:, valid], hf_positions[:, valid])
    assert expected.shape == got.shape
    diff = float(np.abs(got - expected)[valid].max())
    MAX_DIFF[tiny.name] = max(MAX_DIFF.get(tiny.name, 0.0), diff)
    print(f"{tiny.name}: max abs logit diff {diff:.3g}")
    assert diff < TOLERANCE, f"max abs logit diff {diff:.3g}"
    assert np.abs(expected[valid]).max() > 0.5  # the check must be sensitive
    return diff


def test_text_only(tiny):
    rng = np.random.default_rng(0)
    assert_close(tiny, make_batch([[int(i) for i in rng.integers(0, 250, 12)]], []))


def test_one_image_with_partial_windows(tiny):
    grids = [(1, 10, 6)]  # merged 5 x 3: windows cut at both edges
    assert_close(tiny, make_batch([image_prompt(np.random.default_rng(1), grids)], grids, seed=1))


def test_two_images_of_different_sizes(tiny):
    grids = [(1, 8, 12), (1, 6, 4)]
    assert_close(tiny, make_batch([image_prompt(np.random.default_rng(2), grids)], grids, seed=2))


def test_padded_batch_mixed_rows(tiny):
    rng = np.random.default_rng(3)
    grids = [(1, 4, 6), (1, 10, 10), (1, 2, 2)]
    rows = [image_prompt(rng, grids[:2]), [int(i) for i in rng.integers(0, 250, 5)],
            image_prompt(rng, grids[2:], text_before=1, text_after=2)]
    assert_close(tiny, make_batch(rows, grids, seed=3))


def test_two_frame_grid(tiny):
    grids = [(2, 4, 6)]  # two temporal frames: windows and full attention stay inside each frame
    assert_close(tiny, make_batch([image_prompt(np.random.default_rng(4), grids)], grids, seed=4))


def test_image_processor_outputs(tiny):
    """pixel_values / image_grid_thw from transformers' PIL image processor (patch 14), two images."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    rng = np.random.default_rng(5)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((112, 168), (84, 56))]
    processor = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=2, temporal_patch_size=2,
                                         size={"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 64})
    out = processor(images=images, return_tensors="np")
    grids = [tuple(int(x) for x in g) for g in out["image_grid_thw"]]
    assert grids == [(1, 8, 12), (1, 6, 4)]
    batch = make_batch([image_prompt(rng, grids)], grids)
    batch["pixel_values"] = np.asarray(out["pixel_values"], np.float32)
    assert (batch["input_ids"] == IMAGE_TOKEN).sum() == batch["pixel_values"].shape[0] // 4
    assert_close(tiny, batch)


@pytest.mark.parametrize("change", ["all_full_attention", "interleaved_mrope", "no_qkv_bias"])
def test_the_check_is_sensitive(tiny, change):
    """Each Qwen2.5-VL specific piece moves the logits far beyond the tolerance when done the Qwen3-VL way."""
    import dataclasses

    import jax

    grids = [(1, 10, 6)]
    batch = make_batch([image_prompt(np.random.default_rng(6), grids)], grids, seed=6)
    base, _ = jax_logits(tiny, batch)
    cfg, params = tiny.cfg, tiny.params
    if change == "all_full_attention":
        cfg = dataclasses.replace(cfg, vision=dataclasses.replace(
            cfg.vision, fullatt_block_indexes=tuple(range(cfg.vision.depth))))
    elif change == "interleaved_mrope":
        cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, mrope_interleaved=True))
    else:
        params = jax.tree.map(lambda a: a, params)
        for name in "qkv":
            params["text"]["layers"][name] = {"kernel": params["text"]["layers"][name]["kernel"]}
    moved, _ = jax_logits(type(tiny)(tiny.hf, tiny.hf_dir, cfg, params), batch)
    assert np.abs(moved - base).max() > 100 * TOLERANCE


def test_window_groups_equal_transformers_window_index():
    import torch
    from transformers.vision_utils import get_vision_window_index

    from vlmgym.models.qwen2_5_vl.vision import window_groups

    grids = [(1, 10, 6), (2, 8, 12), (1, 4, 4), (1, 16, 2)]
    for window in (1, 2, 3, 4):
        index, cu = get_vision_window_index(torch.tensor(grids), spatial_merge_size=2, window_size=window * 28,
                                            patch_size=14)
        groups, offset = [], 0
        for t, h, w in grids:
            groups += [g + offset for g in window_groups(t, h, w, 2, window)]
            offset += t * h * w // 4
        np.testing.assert_array_equal(np.concatenate(groups), index.numpy())
        np.testing.assert_array_equal(np.cumsum([0] + [4 * len(g) for g in groups]), cu.numpy())
