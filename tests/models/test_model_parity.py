"""The JAX Qwen3-VL equals transformers' Qwen3VLForConditionalGeneration (fp32 logits within 1e-4)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from qwen_fixtures import hf_forward, image_prompt, make_batch

from vlmgym.models.qwen3_vl import model as qwen
from vlmgym.models.qwen3_vl.vision import encode_images

pytestmark = pytest.mark.slow

TOLERANCE = 1e-4


def jax_forward(tiny, batch, position_ids):
    """JAX logits for a batch (images encoded with the same grids) using transformers' position ids."""
    image_embeds = deepstack = None
    if batch["pixel_values"] is not None:
        image_embeds, deepstack = encode_images(tiny.params, tiny.cfg, jnp.asarray(batch["pixel_values"]),
                                                [tuple(g) for g in batch["grid_thw"]])
    logits = qwen.jit_forward(tiny.params, tiny.cfg, jnp.asarray(batch["input_ids"], jnp.int32),
                              jnp.asarray(batch["attention_mask"], jnp.int32), jnp.asarray(position_ids, jnp.int32),
                              image_embeds, deepstack)
    return np.asarray(logits)


def assert_close(tiny, batch):
    expected, position_ids = hf_forward(tiny.hf, batch)
    got = jax_forward(tiny, batch, position_ids)
    valid = batch["attention_mask"].astype(bool)
    diff = np.abs(got - expected)[valid]
    assert expected.shape == got.shape
    assert diff.max() < TOLERANCE, f"max abs logit diff {diff.max():.3g}"
    # the check must be sensitive: logits are far from trivially small
    assert np.abs(expected[valid]).max() > 0.5


@pytest.fixture(params=["tiny_tied", "tiny_untied"])
def tiny(request):
    return request.getfixturevalue(request.param)


def test_text_only(tiny):
    rng = np.random.default_rng(0)
    assert_close(tiny, make_batch([[int(i) for i in rng.integers(0, 250, 12)]], []))


def test_one_image(tiny):
    grids = [(1, 6, 4)]
    assert_close(tiny, make_batch([image_prompt(np.random.default_rng(1), grids)], grids, seed=1))


def test_two_images_of_different_sizes(tiny):
    grids = [(1, 4, 4), (1, 2, 8)]
    assert_close(tiny, make_batch([image_prompt(np.random.default_rng(2), grids)], grids, seed=2))


def test_padded_batch_mixed_rows(tiny):
    rng = np.random.default_rng(3)
    grids = [(1, 4, 6), (1, 4, 4), (1, 2, 2)]
    rows = [image_prompt(rng, grids[:2]), [int(i) for i in rng.integers(0, 250, 5)],
            image_prompt(rng, grids[2:], text_before=1, text_after=2)]
    assert_close(tiny, make_batch(rows, grids, seed=3))


def test_image_token_count_mismatch_raises(tiny_tied):
    grids = [(1, 4, 4)]
    batch = make_batch([image_prompt(np.random.default_rng(4), grids)], grids)
    image_embeds, deepstack = encode_images(tiny_tied.params, tiny_tied.cfg, jnp.asarray(batch["pixel_values"]),
                                            grids)
    with pytest.raises(ValueError, match="tokens: 4, features: 3"):
        qwen.forward(tiny_tied.params, tiny_tied.cfg, jnp.asarray(batch["input_ids"]),
                     jnp.asarray(batch["attention_mask"]), None, image_embeds[:3], deepstack[:, :3])


def test_patch_bucket_padding_keeps_image_features(tiny_untied):
    from vlmgym.models.qwen3_vl.vision import encode_patches, patch_layout

    grids = [(1, 4, 6), (1, 2, 2)]
    pixels = make_batch([[0]], grids, seed=5)["pixel_values"]
    exact = encode_images(tiny_untied.params, tiny_untied.cfg, jnp.asarray(pixels), grids)
    layout = patch_layout(tiny_untied.cfg, grids, pad_to=64)
    padded_pixels = jnp.concatenate([jnp.asarray(pixels), jnp.ones((64 - len(pixels), pixels.shape[1]))])
    padded = encode_patches(tiny_untied.params, tiny_untied.cfg, padded_pixels, layout)
    n = len(pixels) // 4
    np.testing.assert_allclose(np.asarray(padded[0][:n]), np.asarray(exact[0]), atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(padded[1][:, :n]), np.asarray(exact[1]), atol=1e-6, rtol=0)


def test_padding_blocks_are_no_longer_than_the_longest_frame(tiny_untied):
    from vlmgym.models.qwen3_vl.vision import patch_layout

    layout = patch_layout(tiny_untied.cfg, [(1, 4, 6), (1, 2, 2)], pad_to=256)
    assert layout["block_index"].shape == (2 + 10, 24)  # 228 padding patches: 9 blocks of 24 and one of 12
    assert layout["patch_slot"].shape == (256,)
