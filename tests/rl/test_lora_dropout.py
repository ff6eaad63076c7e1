"""LoRA dropout (`lora.dropout`): on the adapter's input in training forwards only, PEFT's x W + s drop(x) A B;
deterministic per (seed, step, iteration, micro-batch), so a resumed run draws the same masks (the trainer's
resume with dropout: tests/rl/test_lora_trainer.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_lora import _policy, randomized

from vlmgym.envs.geospot import GeospotEnv
from vlmgym.models.qwen3_vl import lora
from vlmgym.rl.loop import CompileCounter
from vlmgym.rl.optim import OptimizerConfig, SubsetOptimizer
from vlmgym.rl.trainer_parts import in_train_mode
from vlmgym.rl.update import sft_gradients

DROPOUT = lora.LoRAConfig(rank=4, alpha=8.0, dropout=0.25, vision=True)


def test_adapter_input_drops_at_the_rate_and_scales_the_rest():
    x = jax.random.normal(jax.random.key(0), (64, 512), jnp.float32) + 3.0  # no element is 0 by chance
    assert lora.adapter_input(x, {}) is x  # no key: an eval forward
    leaves = {"lora_dropout_key": jax.random.key(7), "lora_dropout_rate": jnp.float32(0.25)}
    dropped = np.asarray(lora.adapter_input(x, leaves))
    kept = dropped != 0
    assert abs(1 - kept.mean() - 0.25) < 0.01  # 32768 draws: the rate within 4 standard deviations
    np.testing.assert_allclose(dropped[kept], np.asarray(x)[kept] / 0.75, rtol=1e-6)
    assert np.array_equal(np.asarray(lora.adapter_input(x, leaves)), dropped)  # the key decides the mask
    other = {**leaves, "lora_dropout_key": jax.random.key(8)}
    assert not np.array_equal(np.asarray(lora.adapter_input(x, other)) != 0, kept)


def test_project_applies_dropout_to_the_adapter_path_only():
    k = jax.random.split(jax.random.key(1), 4)
    x = jax.random.normal(k[0], (3, 5, 16))
    p = {"kernel": jax.random.normal(k[1], (16, 8)), "lora_a": jax.random.normal(k[2], (16, 4)),
         "lora_b": jax.random.normal(k[3], (4, 8)), "lora_scale": jnp.float32(2.0)}
    key = jax.random.key(3)
    with_dropout = {**p, "lora_dropout_key": key, "lora_dropout_rate": jnp.float32(0.5)}
    keep = jax.random.bernoulli(key, 0.5, x.shape)
    expected = x @ p["kernel"] + ((jnp.where(keep, x / 0.5, 0.0) @ p["lora_a"]) @ p["lora_b"]) * 2.0
    np.testing.assert_allclose(np.asarray(lora.project(x, with_dropout)), np.asarray(expected), rtol=1e-5,
                               atol=1e-5)
    assert not np.allclose(np.asarray(lora.project(x, p)), np.asarray(expected), atol=1e-3)


def test_dropout_inputs_are_per_step_iteration_and_micro_batch():
    assert lora.dropout_inputs(None, 0, 0, 0) == {} and lora.dropout_inputs(lora.LoRAConfig(rank=4), 0, 0, 0) == {}
    keys = {(s, i, m): lora.dropout_inputs(DROPOUT, s, i, m)["dropout_key"].tobytes()
            for s in range(2) for i in range(2) for m in range(2)}
    assert len(set(keys.values())) == 8
    assert lora.dropout_inputs(DROPOUT, 1, 0, 1)["dropout_key"].tobytes() == keys[(1, 0, 1)]
    assert lora.dropout_inputs(DROPOUT, 0, 0, 0)["dropout_rate"] == np.float32(0.25)
    micro = in_train_mode([{"mask": 1}, {"mask": 2}], DROPOUT, step=3)
    assert [m["mask"] for m in micro] == [1, 2]
    assert micro[0]["dropout_key"].tobytes() != micro[1]["dropout_key"].tobytes()
    assert in_train_mode([{"mask": 1}], None, step=3) == [{"mask": 1}]


def _sft_setup(tiny_vlm):
    policy = _policy(tiny_vlm)
    tokens, mask = policy.encode_targets(["Country: France", "City: Berlin"])
    env = GeospotEnv(tiny_vlm.samples, tokenizer=tiny_vlm.processor.tokenizer)
    batch = policy.build_batch([env.reset(i)[1] for i in range(2)], tokens, mask)
    adapted = lora.init_adapters(tiny_vlm.params, tiny_vlm.cfg, DROPOUT)
    optimizer = SubsetOptimizer(OptimizerConfig(learning_rate=1e-3), lora.trainable_mask(adapted))

    compiles = CompileCounter()  # one counter: a static argument, so a new one per call would compile each call

    def gradients(params, micro):
        loss, grads, _ = sft_gradients(params, micro, jnp.float32(mask.sum()), policy=policy, optimizer=optimizer,
                                       compiles=compiles)
        return float(loss), [np.asarray(g) for g in grads]

    return {"batch": batch, "mask": mask}, adapted, gradients


def test_dropout_changes_the_training_loss_per_key_and_leaves_the_tree_alone(tiny_vlm):
    micro, adapted, gradients = _sft_setup(tiny_vlm)
    trained = randomized(adapted)  # B != 0: the adapters change the outputs
    plain = gradients(trained, micro)
    first, second = (gradients(trained, {**micro, **lora.dropout_inputs(DROPOUT, 0, 0, index)}) for index in (0, 1))
    assert first[0] != plain[0] and first[0] != second[0]  # the masks change the loss, per key
    again = gradients(trained, {**micro, **lora.dropout_inputs(DROPOUT, 0, 0, 0)})
    assert again[0] == first[0] and all(np.array_equal(a, b) for a, b in zip(again[1], first[1]))
    # B = 0 (a fresh adapter): dropout cannot change the loss, only B's gradients (A's are 0 either way)
    fresh_plain = gradients(adapted, micro)
    fresh_dropped = gradients(adapted, {**micro, **lora.dropout_inputs(DROPOUT, 0, 0, 0)})
    assert fresh_dropped[0] == pytest.approx(fresh_plain[0], abs=1e-6)
    assert any(not np.allclose(a, b, atol=1e-7) for a, b in zip(fresh_dropped[1], fresh_plain[1]))
    # the keys and rate lived inside the loss only: the caller's tree (what sampling and eval see) has none
    assert not any(name in leaf for leaf in lora.adapted_denses(trained).values() for name in lora.DROPOUT_LEAVES)


def test_dropout_matches_peft_in_expectation_of_the_mask():
    # PEFT's Linear: result + lora_B(lora_A(dropout(x))) * scaling, with torch's inverted dropout: the expected
    # adapter input is x. Averaged over many keys the dropped projection tends to the plain one.
    x = jnp.ones((1, 8), jnp.float32)
    p = {"kernel": jnp.zeros((8, 2)), "lora_a": jnp.ones((8, 1)), "lora_b": jnp.ones((1, 2)),
         "lora_scale": jnp.float32(1.0), "lora_dropout_rate": jnp.float32(0.5)}
    outs = jax.vmap(lambda k: lora.project(x, {**p, "lora_dropout_key": k}))(jax.random.split(jax.random.key(0),
                                                                                              4000))
    assert float(outs.mean()) == pytest.approx(8.0, rel=0.02)  # x A B = 8 without dropout


def test_peft_adapter_config_names_the_dropout(tiny_vlm, tmp_path):
    adapted = lora.init_adapters(tiny_vlm.params, tiny_vlm.cfg, DROPOUT)
    assert lora.peft_state(adapted, 0.25)[1]["lora_dropout"] == 0.25
    assert lora.peft_state(adapted)[1]["lora_dropout"] == 0.0
