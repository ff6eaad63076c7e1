"""vlmgym's Qwen2.5-VL image preprocessing equals transformers' Qwen2VLImageProcessorPil with the same settings."""

from __future__ import annotations

import dataclasses

import numpy as np
from PIL import Image

from vlmgym.models.qwen2_5_vl.processor import IMAGE_SETTINGS, preprocess_images


def test_equals_transformers_pil_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    rng = np.random.default_rng(0)
    # aligned, resized (not multiples of 28), and scaled up to the pixel budget's floor
    sizes = [(112, 168), (101, 250), (30, 40)]
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    settings = dataclasses.replace(IMAGE_SETTINGS, max_pixels=28 * 28 * 64)
    pixels, grids = preprocess_images(images, settings)
    hf = Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2,
                                  size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels})
    out = hf(images=images, return_tensors="np")
    np.testing.assert_array_equal(grids, out["image_grid_thw"])
    assert pixels.shape == out["pixel_values"].shape and pixels.shape[1] == 3 * 2 * 14 * 14
    np.testing.assert_array_equal(pixels, out["pixel_values"])
    assert [tuple(g) for g in grids][0] == (1, 8, 12)
