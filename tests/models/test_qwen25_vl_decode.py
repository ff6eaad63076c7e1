"""JAX Qwen2.5-VL prefill + decode steps (the shared KV-cache decoder) reproduce transformers' greedy `generate`
(tokens equal, each step's logits within 1e-4), and a padded patch bucket leaves the image features unchanged."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from qwen25_fixtures import IMAGE_TOKEN, image_prompt, make_batch, make_tiny, rope_index

from vlmgym.models.qwen2_5_vl.vision import encode_images, encode_patches, patch_layout
from vlmgym.models.qwen3_vl import model as decoder

pytestmark = pytest.mark.slow

STEPS = 5
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("q25_decode"), False, (1, 3), 2, seed=11)


def test_greedy_decode_equals_transformers_generate(tiny):
    import torch

    rng = np.random.default_rng(8)
    grids = [(1, 6, 10), (1, 4, 4)]
    rows = [image_prompt(rng, grids), [int(i) for i in rng.integers(0, 250, 7)]]
    batch = make_batch(rows, grids, seed=8)
    input_ids, mask = torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"])
    with torch.no_grad():
        tiny.hf.model.rope_deltas = None
        out = tiny.hf.generate(input_ids=input_ids, attention_mask=mask,
                               pixel_values=torch.from_numpy(batch["pixel_values"]),
                               image_grid_thw=torch.from_numpy(batch["grid_thw"]),
                               mm_token_type_ids=(input_ids == IMAGE_TOKEN).int(), max_new_tokens=STEPS,
                               min_new_tokens=STEPS, do_sample=False, output_logits=True,
                               return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    hf_tokens = out.sequences[:, input_ids.shape[1]:].numpy()
    hf_logits = np.stack([step.float().numpy() for step in out.logits], axis=1)

    image_embeds = encode_images(tiny.params, tiny.cfg, jnp.asarray(batch["pixel_values"]), grids)
    positions, _ = rope_index(tiny.cfg, batch["input_ids"], batch["grid_thw"], batch["attention_mask"])
    logits, cache = decoder.prefill(tiny.params, tiny.cfg, jnp.asarray(batch["input_ids"], jnp.int32),
                                   jnp.asarray(batch["attention_mask"], jnp.int32), jnp.asarray(positions),
                                   image_embeds, cache_size=64)
    tokens, steps = [], []
    for _ in range(STEPS):
        steps.append(np.asarray(logits))
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        tokens.append(np.asarray(token))
        logits, cache = decoder.decode_step(tiny.params, tiny.cfg, token, cache)
    np.testing.assert_array_equal(np.stack(tokens, axis=1), hf_tokens)
    diff = np.abs(np.stack(steps, axis=1) - hf_logits).max()
    print(f"greedy decode: max abs logit diff {diff:.3g}")
    assert diff < TOLERANCE


def test_patch_bucket_padding_keeps_image_features(tiny):
    grids = [(1, 6, 10), (1, 2, 2)]
    pixels = make_batch([[0]], grids, seed=9)["pixel_values"]
    exact = np.asarray(encode_images(tiny.params, tiny.cfg, jnp.asarray(pixels), grids))
    layout = patch_layout(tiny.cfg, grids, pad_to=128)
    assert layout["full_index"].shape[1] == 60 and layout["window_index"].shape[1] == 16  # no block outgrows a real one
    padded_pixels = jnp.concatenate([jnp.asarray(pixels), jnp.ones((128 - len(pixels), pixels.shape[1]))])
    padded = np.asarray(encode_patches(tiny.params, tiny.cfg, padded_pixels, layout))
    np.testing.assert_allclose(padded[:len(exact)], exact, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="multiple of 4"):
        patch_layout(tiny.cfg, grids, pad_to=66)
