"""The shared-prefix learner forward equals the per-copy one: log-probs and gradients, with images, padding and EOS."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from vlmgym.envs.geospot import PROMPT
from vlmgym.models.qwen3_vl.shared_prefix import shared_prefix_logprobs
from vlmgym.rl.policy import Qwen3VLPolicy
from vlmgym.rollout.sampling import SamplingSettings

pytestmark = pytest.mark.slow

GROUP = 3


def _observations(kind):
    rng = np.random.default_rng(1)

    def image(width, height):
        return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))

    if kind == "one image":  # different sizes: different prompt lengths, so the shorter prompt is left-padded
        sizes = [[(64, 64)], [(96, 80)]]
    else:  # two images per prompt, of different sizes
        sizes = [[(64, 64), (96, 64)], [(80, 64), (64, 64)]]
    return [{"images": [image(*size) for size in row],
             "messages": [{"role": "user", "content": [{"type": "image"} for _ in row]
                           + [{"type": "text", "text": PROMPT}]}]} for row in sizes]


def _completions(tiny_vlm, policy, observations):
    """Sampled completions with assorted lengths: full, ended by EOS early, a single token, fully masked; one
    holds an <|image_pad|> token (a plain token in a completion, not an image slot)."""
    samples = policy.sample(tiny_vlm.params, observations, GROUP, jax.random.key(3))
    tokens, mask = samples.tokens.copy(), np.zeros(samples.mask.shape, np.float32)
    for row, length in enumerate([8, 3, 1, 5, 0, 8][: len(tokens)]):
        mask[row, :length] = 1
        if 0 < length < tokens.shape[1]:
            tokens[row, length - 1] = policy.end_of_turn
    tokens[0, 2] = tiny_vlm.cfg.image_token_id
    return tokens, mask


def _policy(tiny_vlm, temperature=1.0, share_prefix=True):
    settings = SamplingSettings(max_new_tokens=8, eos_ids=tuple(tiny_vlm.processor.eos_token_ids),
                                pad_id=int(tiny_vlm.processor.pad_token_id), temperature=temperature)
    return Qwen3VLPolicy(tiny_vlm.cfg, tiny_vlm.processor, settings, share_prefix=share_prefix)


# The prompt layout (one or two images) and the temperature (it scales the logits inside the shared forward) are
# independent of each other: each value is checked once, not in every combination.
@pytest.mark.parametrize(("kind", "temperature"), [("one image", 1.0), ("two images", 0.7)])
def test_shared_prefix_logprobs_and_gradients_equal_the_per_copy_ones(tiny_vlm, kind, temperature):
    shared_policy = _policy(tiny_vlm, temperature)
    per_copy_policy = _policy(tiny_vlm, temperature, share_prefix=False)
    observations = _observations(kind)
    tokens, mask = _completions(tiny_vlm, shared_policy, observations)
    shared = shared_policy.build_batch(observations, tokens, mask)
    per_copy = per_copy_policy.build_batch(observations, tokens, mask)
    assert shared["inputs"]["input_ids"].shape[0] == len(observations)
    assert per_copy["inputs"]["input_ids"].shape[0] == len(tokens) == GROUP * len(observations)
    assert 2 * len(shared["inputs"]["pixel_values"]) < len(per_copy["inputs"]["pixel_values"])  # images once
    assert (np.asarray(shared["inputs"]["attention_mask"]) == 0).any()  # a left-padded prompt
    weights = jnp.asarray(np.random.default_rng(0).standard_normal(mask.shape).astype(np.float32))

    def objective(policy):
        return jax.jit(jax.value_and_grad(
            lambda params, batch: (policy.logprobs(params, batch) * weights).sum(), has_aux=False))

    def logprobs(policy, batch):
        return np.asarray(jax.jit(policy.logprobs)(tiny_vlm.params, batch))

    np.testing.assert_allclose(logprobs(shared_policy, shared), logprobs(per_copy_policy, per_copy), atol=1e-5)
    shared_entropies = jax.jit(shared_policy.logprobs_and_entropies)(tiny_vlm.params, shared)[1]
    per_copy_entropies = jax.jit(per_copy_policy.logprobs_and_entropies)(tiny_vlm.params, per_copy)[1]
    np.testing.assert_allclose(np.asarray(shared_entropies), np.asarray(per_copy_entropies), atol=1e-5)
    assert (np.asarray(shared_entropies)[mask == 0] == 0).all() and np.asarray(shared_entropies).max() > 0
    assert (logprobs(shared_policy, shared)[mask == 0] == 0).all()
    _, shared_grads = objective(shared_policy)(tiny_vlm.params, shared)
    _, per_copy_grads = objective(per_copy_policy)(tiny_vlm.params, per_copy)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(shared_grads), jax.tree.leaves(per_copy_grads)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = max(np.abs(b).max(), 1e-12)
        assert np.abs(a - b).max() / scale < 1e-5, (jax.tree_util.keystr(path), np.abs(a - b).max(), scale)
    # The vision tower gets gradient from the prompts, once per group here and G times per copy there.
    assert np.abs(np.asarray(shared_grads["visual"]["patch_embed"]["kernel"])).max() > 0


def test_a_completion_image_pad_token_is_a_plain_token(tiny_vlm):
    # The learner embeds completion tokens as the sampler decoded them; writing image features at a sampled
    # <|image_pad|> used to shift the image features of every later row in the per-copy batch.
    policy = _policy(tiny_vlm, share_prefix=False)
    observations = _observations("one image")
    tokens, mask = _completions(tiny_vlm, policy, observations)
    batch = policy.build_batch(observations, tokens, mask)
    with_pad = np.asarray(jax.jit(policy.logprobs)(tiny_vlm.params, batch))
    clean = tokens.copy()
    clean[0, 2] = policy.end_of_turn
    without = np.asarray(jax.jit(policy.logprobs)(tiny_vlm.params, policy.build_batch(observations, clean, mask)))
    # Row 0 changes from the swapped token on; every other row, each with its own images, is unaffected.
    np.testing.assert_allclose(with_pad[1:], without[1:], atol=1e-6)
    np.testing.assert_allclose(with_pad[0, :2], without[0, :2], atol=1e-6)


def test_the_group_size_must_divide_the_rows(tiny_vlm):
    policy = _policy(tiny_vlm)
    tokens = np.zeros((5, 8), np.int32)
    with pytest.raises(ValueError, match="not whole groups of 2 observations"):
        policy.build_batch(_observations("one image"), tokens, np.ones((5, 8), np.float32))
    batch = {"attention_mask": jnp.ones((2, 4), jnp.int32), "input_ids": jnp.zeros((2, 4), jnp.int32)}
    with pytest.raises(ValueError, match="not a whole number of groups"):
        shared_prefix_logprobs(tiny_vlm.params, tiny_vlm.cfg, batch, tokens, np.ones((5, 8), np.float32))

