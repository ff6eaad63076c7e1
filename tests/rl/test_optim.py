"""AdamW schedule, clipping, trainable subsets and fp32 master weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vlmgym.rl.optim import (
    Optimizer,
    OptimizerConfig,
    learning_rate_schedule,
    trainable_mask,
)


def _params(dtype=jnp.float32):
    return {
        "visual": {"patch": jnp.array([[-0.0, 1.0], [2.0, jnp.nan]], dtype), "bias": jnp.array([0.5, -0.0], dtype)},
        "text": {"w": jnp.full((2, 2), 0.02, dtype), "norm": jnp.ones((2,), dtype)},
    }


def test_schedule_warmup_then_cosine():
    schedule = learning_rate_schedule(OptimizerConfig(learning_rate=1.0, warmup_steps=4, total_steps=14,
                                                      end_lr_ratio=0.1))
    assert float(schedule(0)) == 0.0
    assert float(schedule(2)) == pytest.approx(0.5)
    assert float(schedule(4)) == pytest.approx(1.0)
    assert float(schedule(9)) == pytest.approx(0.55)  # half-way through the cosine: (1 + 0.1) / 2
    assert float(schedule(14)) == pytest.approx(0.1)


def test_trainable_mask_vision_frozen():
    mask = trainable_mask(_params(), "vision")
    assert mask == {"visual": {"patch": False, "bias": False}, "text": {"w": True, "norm": True}}
    assert all(jax.tree.leaves(trainable_mask(_params(), "none")))
    with pytest.raises(ValueError, match="no parameter path"):
        trainable_mask({"text": {"w": jnp.zeros(2)}}, "vision")
    with pytest.raises(ValueError, match="freeze"):
        trainable_mask(_params(), "text")


def test_first_adamw_step_hand_example_and_true_grad_norm():
    params = {"w": jnp.array([[1.0, -2.0]]), "b": jnp.array([3.0])}
    config = OptimizerConfig(learning_rate=0.1, total_steps=10, end_lr_ratio=1.0, weight_decay=0.5,
                             max_grad_norm=1.0, eps=0.0)
    optimizer = Optimizer(config, trainable_mask(params))
    grads = {"w": jnp.array([[2.0, -1.0]]), "b": jnp.array([-2.0])}
    new_params, state, stats = optimizer.update(grads, optimizer.init(params), params)
    assert float(stats["grad_norm"]) == pytest.approx(3.0)  # the norm, not its square (9)
    assert float(stats["learning_rate"]) == pytest.approx(0.1)
    # Bias-corrected first Adam step is sign(g) (any clipping scale cancels); the matrix also decays.
    np.testing.assert_allclose(new_params["w"], [[1.0 - 0.1 * (1 + 0.5 * 1.0), -2.0 - 0.1 * (-1 + 0.5 * -2.0)]],
                               rtol=1e-6)
    np.testing.assert_allclose(new_params["b"], [3.0 + 0.1], rtol=1e-6)
    assert int(state.step) == 1


def test_frozen_vision_tower_stays_bit_identical():
    params = _params()
    mask = trainable_mask(params, "vision")
    optimizer = Optimizer(OptimizerConfig(learning_rate=0.1, weight_decay=0.1), mask)
    state = optimizer.init(params)
    update = jax.jit(optimizer.update)
    current = params
    for scale in (1.0, 2.0, 3.0):
        grads = jax.tree.map(lambda p, s=scale: jnp.full(p.shape, s, p.dtype), params)
        current, state, _ = update(grads, state, current)
    for name in ("patch", "bias"):
        before = np.asarray(params["visual"][name]).view(np.uint32)
        after = np.asarray(current["visual"][name]).view(np.uint32)
        np.testing.assert_array_equal(before, after)  # bits, so -0.0 and NaN payloads count too
    assert not np.allclose(current["text"]["w"], params["text"]["w"])
    # Frozen leaves hold no optimizer state at all.
    frozen_state = [x for x in jax.tree.leaves(state) if getattr(x, "shape", None) == (2, 2)]
    assert len(frozen_state) == 2  # Adam mu and nu of text/w only


def test_bf16_params_keep_an_fp32_master_so_tiny_updates_accumulate():
    params = {"w": jnp.full((2, 2), 0.02, jnp.bfloat16)}
    optimizer = Optimizer(OptimizerConfig(learning_rate=5e-7, total_steps=1000, end_lr_ratio=1.0,
                                          max_grad_norm=0.0), trainable_mask(params))
    state = optimizer.init(params)
    assert state.master["w"].dtype == jnp.float32
    update = jax.jit(optimizer.update)
    grads = {"w": jnp.ones((2, 2), jnp.bfloat16)}
    current, state, _ = update(grads, state, params)
    assert current["w"].dtype == jnp.bfloat16
    # One step of 5e-7 is far below half a bf16 ulp at 0.02: the bf16 weight does not move, the master does.
    np.testing.assert_array_equal(np.asarray(current["w"]), np.asarray(params["w"]))
    assert float(state.master["w"][0, 0]) == pytest.approx(float(params["w"][0, 0].astype(jnp.float32)) - 5e-7,
                                                           abs=1e-9)
    for _ in range(199):
        current, state, _ = update(grads, state, current)
    # 200 steps move the master by 1e-4, more than a bf16 ulp: the rounded weight has followed.
    assert float(current["w"][0, 0]) < float(params["w"][0, 0])
    np.testing.assert_array_equal(np.asarray(current["w"]), np.asarray(state.master["w"].astype(jnp.bfloat16)))

