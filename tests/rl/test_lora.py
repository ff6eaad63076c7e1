"""LoRA: B = 0 is the base model exactly, adapters equal their merged kernel, gradients equal the dense chain rule,
and the optimizer holds only the adapters."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vlmgym.envs.geospot import GeospotEnv
from vlmgym.models.qwen3_vl import lora
from vlmgym.models.qwen3_vl.model import decode_step, prefill
from vlmgym.rl.loop import CompileCounter
from vlmgym.rl.optim import Optimizer, OptimizerConfig, SubsetOptimizer
from vlmgym.rl.policy import Qwen3VLPolicy
from vlmgym.rl.update import sft_gradients
from vlmgym.rollout.sampling import SamplingSettings

pytestmark = pytest.mark.slow

ALL = lora.LoRAConfig(rank=4, alpha=8.0, vision=True)


def _policy(tiny_vlm, share_prefix=True):
    settings = SamplingSettings(max_new_tokens=8, eos_ids=tuple(tiny_vlm.processor.eos_token_ids),
                                pad_id=int(tiny_vlm.processor.pad_token_id))
    return Qwen3VLPolicy(tiny_vlm.cfg, tiny_vlm.processor, settings, share_prefix=share_prefix)


def _batch(tiny_vlm, policy, group=2):
    env = GeospotEnv(tiny_vlm.samples, tokenizer=tiny_vlm.processor.tokenizer)
    observations = [env.reset(i)[1] for i in range(2)]
    rng = np.random.default_rng(0)
    tokens = rng.integers(20, tiny_vlm.cfg.text.vocab_size, (2 * group, 8)).astype(np.int32)
    mask = np.ones(tokens.shape, np.float32)
    mask[1, 5:] = 0
    return policy.build_batch(observations, tokens, mask), mask


def randomized(params, seed=1):
    """Adapters with random B too (as after training), so they change the outputs."""
    key = jax.random.key(seed)

    def leaf(path, x):
        if getattr(path[-1], "key", None) != "lora_b":
            return x
        return 0.05 * jax.random.normal(jax.random.fold_in(key, hash(jax.tree_util.keystr(path)) % 1000), x.shape)

    return jax.tree_util.tree_map_with_path(leaf, params)


@pytest.mark.parametrize("share_prefix", [True, False])
def test_zero_b_is_the_base_model_exactly(tiny_vlm, share_prefix):
    policy = _policy(tiny_vlm, share_prefix)
    batch, _ = _batch(tiny_vlm, policy)
    adapted = lora.init_adapters(tiny_vlm.params, tiny_vlm.cfg, ALL)
    assert len(lora.adapted_paths(adapted)) == 11
    assert any(float(jnp.abs(a).max()) > 0 for a in jax.tree.leaves(lora.adapters(adapted)))
    base = np.asarray(policy.logprobs(tiny_vlm.params, batch))
    # Equal up to fp32 rounding of the compiled program: the adapted forward is another XLA program (its extra
    # dots change fusion and summation order), measured at most 1 ulp (4.8e-7 at |logprob| ~6).
    np.testing.assert_allclose(np.asarray(policy.logprobs(adapted, batch)), base, atol=1e-6, rtol=0)
    # ... and a non-zero B does change them (the check can fail)
    assert np.abs(np.asarray(policy.logprobs(randomized(adapted), batch)) - base).max() > 1e-3


def test_adapters_equal_their_merged_kernels(tiny_vlm):
    policy = _policy(tiny_vlm)
    batch, _ = _batch(tiny_vlm, policy)
    adapted = randomized(lora.init_adapters(tiny_vlm.params, tiny_vlm.cfg, ALL))
    merged = lora.merge(adapted)
    assert not lora.has_adapters(merged)
    assert jax.tree.structure(merged) == jax.tree.structure(tiny_vlm.params)
    np.testing.assert_allclose(np.asarray(policy.logprobs(adapted, batch)), np.asarray(policy.logprobs(merged, batch)),
                               atol=1e-5, rtol=0)
    # prefill + one decode step (what the rollout engine runs) sample from the adapted policy too
    ids = np.asarray(batch["inputs"]["input_ids"])[:, -6:]
    attention = np.ones_like(ids)
    outs = []
    for params in (adapted, merged):
        logits, cache = prefill(params, tiny_vlm.cfg, ids, attention, cache_size=8)
        step, _ = decode_step(params, tiny_vlm.cfg, jnp.argmax(logits, -1).astype(jnp.int32), cache)
        outs.append((np.asarray(logits), np.asarray(step)))
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_strip_is_the_base_without_a_copy(tiny_vlm):
    adapted = lora.init_adapters(tiny_vlm.params, tiny_vlm.cfg, ALL)
    base = lora.strip(adapted)
    assert jax.tree.structure(base) == jax.tree.structure(tiny_vlm.params)
    for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(tiny_vlm.params)):
        assert a is b
    restored = lora.attach(tiny_vlm.params, lora.adapters(adapted))
    assert jax.tree.structure(restored) == jax.tree.structure(adapted)


def test_adapter_gradients_equal_the_dense_chain_rule(tiny_vlm):
    # The factored forward's gradients w.r.t. A and B against differentiating the merged kernel W + s A B.
    policy = _policy(tiny_vlm)
    tokens, mask = policy.encode_targets(["Country: France", "City: Berlin"])
    env = GeospotEnv(tiny_vlm.samples, tokenizer=tiny_vlm.processor.tokenizer)
    batch = policy.build_batch([env.reset(i)[1] for i in range(2)], tokens, mask)
    adapted = randomized(lora.init_adapters(tiny_vlm.params, tiny_vlm.cfg, ALL))
    optimizer = SubsetOptimizer(OptimizerConfig(learning_rate=1e-3), lora.trainable_mask(adapted))
    normalizer = jnp.float32(mask.sum())
    loss, grads, _ = sft_gradients(adapted, {"batch": batch, "mask": mask}, normalizer, policy=policy,
                                   optimizer=optimizer, compiles=CompileCounter())
    assert len(grads) == 2 * 11

    def dense_loss(trained):
        logprobs = policy.logprobs(lora.merge(optimizer.fill(adapted, trained)), batch)
        return -(logprobs * mask).sum() / normalizer

    dense_value, dense = jax.value_and_grad(dense_loss)(optimizer.select(adapted))
    assert float(loss) == pytest.approx(float(dense_value), abs=1e-5)
    for g, d in zip(grads, dense):
        scale = float(jnp.abs(d).max())
        assert scale > 0
        assert float(jnp.abs(g - d).max()) <= 1e-4 * scale + 1e-7


def test_optimizer_state_holds_only_the_adapters(tiny_vlm):
    adapted = lora.init_adapters(tiny_vlm.params, tiny_vlm.cfg, lora.LoRAConfig(rank=4))
    optimizer = SubsetOptimizer(OptimizerConfig(learning_rate=1e-3), lora.trainable_mask(adapted))
    state = optimizer.init(adapted)
    trained = optimizer.select(adapted)
    adapter_bytes = sum(x.nbytes for x in trained)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    full_state = Optimizer(OptimizerConfig(), jax.tree.map(lambda _: True, tiny_vlm.params)).init(tiny_vlm.params)
    # Adam's two moments per adapter leaf (fp32 adapters: no master copy), plus a few scalars
    assert len(trained) == 14
    assert adapter_bytes * 2 <= state_bytes <= adapter_bytes * 2 + 64
    assert state_bytes < sum(x.nbytes for x in jax.tree.leaves(full_state)) / 10
    # one update moves only the adapters; every base leaf is the same array
    grads = [jnp.ones_like(x) for x in trained]
    new, _, _ = jax.jit(optimizer.update)(grads, state, adapted)
    for path, a in jax.tree_util.tree_leaves_with_path(new):
        name = getattr(path[-1], "key", "")
        b = dict(jax.tree_util.tree_leaves_with_path(adapted))[path]
        changed = not np.array_equal(np.asarray(a), np.asarray(b))
        assert changed == (name in lora.TRAINED_LEAVES), jax.tree_util.keystr(path)


def test_sft_update_trains_only_adapters(tiny_vlm):
    policy = _policy(tiny_vlm)
    tokens, mask = policy.encode_targets(["Country: France", "City: Berlin"])
    env = GeospotEnv(tiny_vlm.samples, tokenizer=tiny_vlm.processor.tokenizer)
    batch = policy.build_batch([env.reset(i)[1] for i in range(2)], tokens, mask)
    adapted = lora.init_adapters(tiny_vlm.params, tiny_vlm.cfg, lora.LoRAConfig(rank=4))
    optimizer = SubsetOptimizer(OptimizerConfig(learning_rate=1e-2), lora.trainable_mask(adapted))
    grad_fn = partial(sft_gradients, policy=policy, optimizer=optimizer, compiles=CompileCounter())
    micro = {"batch": batch, "mask": mask}
    before, grads, _ = grad_fn(adapted, micro, jnp.float32(mask.sum()))
    state = optimizer.init(adapted)
    for _ in range(3):
        adapted, state, _ = optimizer.update(grads, state, adapted)
        loss, grads, _ = grad_fn(adapted, micro, jnp.float32(mask.sum()))
    assert float(loss) < float(before)
    for a, b in zip(jax.tree.leaves(lora.strip(adapted)), jax.tree.leaves(tiny_vlm.params)):
        assert a is b


def test_sampling_params_merge_only_the_adapted_kernels(tiny_vlm):
    from vlmgym.rl.policy import sampling_params

    assert sampling_params(tiny_vlm.params) is tiny_vlm.params  # LoRA off: untouched
    adapted = randomized(lora.init_adapters(tiny_vlm.params, tiny_vlm.cfg, ALL))
    sampled = sampling_params(adapted)
    assert jax.tree.structure(sampled) == jax.tree.structure(tiny_vlm.params)
    merged = lora.merge(adapted)
    for (path, a), b, base in zip(jax.tree_util.tree_leaves_with_path(sampled), jax.tree.leaves(merged),
                                  jax.tree.leaves(tiny_vlm.params)):
        if getattr(path[-1], "key", None) == "kernel" and path[-2].key in lora.TEXT_TARGETS + lora.VISION_TARGETS \
                and path[1].key in ("layers", "blocks"):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)
            assert not np.array_equal(np.asarray(a), np.asarray(base))
        else:
            assert a is base  # every other leaf is the base's own array: no copy
