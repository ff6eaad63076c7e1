"""GRPO pure functions and the objective's group advantages against hand-computed examples."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vlmgym.rl import grpo
from vlmgym.rl.objective import group_advantages


def test_group_advantages_group_scaling_hand_example():
    rewards = jnp.array([1.0, 2.0, 3.0, 4.0])
    std = math.sqrt(1.25)  # population std of 1..4
    expected = np.array([-1.5, -0.5, 0.5, 1.5]) / (std + 1e-4)
    np.testing.assert_allclose(group_advantages(rewards, 4, "group"), expected, rtol=1e-6)


def test_group_advantages_two_groups_batch_and_none():
    rewards = jnp.array([0.0, 1.0, 2.0, 2.0])
    batch_std = math.sqrt(0.6875)  # deviations from 1.25: -1.25, -0.25, 0.75, 0.75
    np.testing.assert_allclose(group_advantages(rewards, 2, "batch"),
                               np.array([-0.5, 0.5, 0.0, 0.0]) / (batch_std + 1e-4), rtol=1e-6)
    np.testing.assert_allclose(group_advantages(rewards, 2, "none"), [-0.5, 0.5, 0.0, 0.0])
    # Group scaling: {0, 1} has population std 0.5; the all-equal group stays at exactly 0.
    np.testing.assert_allclose(group_advantages(rewards, 2, "group"),
                               [-0.5 / 0.5001, 0.5 / 0.5001, 0.0, 0.0], rtol=1e-6)


def test_leave_one_out_baseline_is_the_mean_of_the_other_answers():
    rewards = jnp.array([1.0, 2.0, 3.0, 6.0, 5.0, 5.0])
    # by hand: each reward minus the mean of the two others in its group of three
    expected = [1 - 2.5, 2 - 2.0, 3 - 1.5, 6 - 5.0, 5 - 5.5, 5 - 5.5]
    # (jitted, XLA's fused mean leaves float noise where the hand value is exactly 0: hence the atol)
    np.testing.assert_allclose(group_advantages(rewards, 3, "none", leave_one_out=True), expected, rtol=1e-6,
                               atol=1e-6)
    # std scaling divides the same numbers; a group of one has no other answer and gets 0
    std = float(np.std([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(group_advantages(rewards, 3, "group", leave_one_out=True)[:3],
                               np.array(expected[:3]) / (std + 1e-4), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(group_advantages(jnp.array([0.3, 0.9]), 1, "none", leave_one_out=True),
                                  [0.0, 0.0])


def test_group_advantages_rejects_bad_input():
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(jnp.zeros(4), 2, "median")
    with pytest.raises(ValueError, match="whole groups"):
        group_advantages(jnp.zeros(5), 2)


def test_filter_groups_counts():
    rewards = np.array([1, 1, 1, 0, 1, 0, 0.5, 0.5, 0.5, 2, 3, 4], np.float32)
    result = grpo.filter_groups(rewards, 3)
    assert result.keep.tolist() == [False, True, False, True]
    assert (result.num_kept, result.num_dropped) == (2, 2)
    np.testing.assert_allclose(grpo.group_reward_std(rewards, 3)[1], math.sqrt(2 / 9))


def test_mask_after_eos_keeps_the_eos_and_drops_the_rest():
    tokens = jnp.array([[5, 7, 2, 9, 2], [1, 1, 1, 1, 1], [2, 4, 4, 4, 4]])
    mask = grpo.mask_after_eos(tokens, (2,))
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    valid = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert grpo.mask_after_eos(tokens, (2,), valid)[1].tolist() == [1, 1, 1, 0, 0]


def test_aggregations_hand_example():
    per_token = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert float(grpo.aggregate(per_token, mask, "token_mean")) == pytest.approx(7 / 3)
    # The row with no active token is not a sequence that counts.
    assert float(grpo.aggregate(per_token, mask, "sequence_mean")) == pytest.approx((1.5 + 4.0) / 2)
    assert float(grpo.aggregate(per_token, mask, "dr_grpo")) == pytest.approx(7 / 9)
    with pytest.raises(ValueError, match="aggregation"):
        grpo.aggregate(per_token, mask, "mean")


@pytest.mark.parametrize("mode", grpo.LOSS_AGGREGATIONS)
def test_micro_batches_with_the_full_batch_normalizer_sum_to_the_full_loss(mode):
    per_token = jax.random.normal(jax.random.key(0), (6, 5))
    mask = (jax.random.uniform(jax.random.key(1), (6, 5)) > 0.3).at[2].set(False)
    full = grpo.aggregate(per_token, mask, mode)
    normalizer = grpo.aggregation_normalizer(mask, mode)
    parts = sum(grpo.aggregate(per_token[i:i + 2], mask[i:i + 2], mode, normalizer) for i in range(0, 6, 2))
    assert float(parts) == pytest.approx(float(full), rel=1e-6)


def test_clipped_surrogate_positive_advantage_hand_example():
    behaviour = jnp.log(jnp.array([[0.2, 0.4, 0.5]]))
    logprobs = behaviour + jnp.log(jnp.array([[1.5, 0.5, 1.1]]))
    out = grpo.grpo_loss(logprobs, behaviour, jnp.array([1.0]), jnp.ones((1, 3)), epsilon=0.2, epsilon_high=0.28)
    # ratio 1.5 is clipped to 1.28; 0.5 with A > 0 is not clipped (min picks the unclipped 0.5); 1.1 is inside.
    assert float(out.loss) == pytest.approx(-(1.28 + 0.5 + 1.1) / 3, rel=1e-6)
    assert float(out.clip_fraction_high) == pytest.approx(1 / 3)
    assert float(out.clip_fraction_low) == 0.0
    # d(-ratio * A)/d logprob = -ratio * A where unclipped, 0 where clipped.
    grads = jax.grad(lambda lp: grpo.grpo_loss(lp, behaviour, jnp.array([1.0]), jnp.ones((1, 3)),
                                               epsilon=0.2, epsilon_high=0.28).loss)(logprobs)
    np.testing.assert_allclose(grads, [[0.0, -0.5 / 3, -1.1 / 3]], rtol=1e-5)


def test_clipped_surrogate_negative_advantage_and_symmetric_default():
    behaviour = jnp.log(jnp.array([[0.2, 0.4, 0.5]]))
    logprobs = behaviour + jnp.log(jnp.array([[1.5, 0.5, 1.1]]))
    out = grpo.grpo_loss(logprobs, behaviour, jnp.array([-1.0]), jnp.ones((1, 3)), epsilon=0.2)
    # -min(-r, -clip(r)) = max(r, clip(r)): 1.5 (unclipped), 0.8 (clipped low), 1.1.
    assert float(out.loss) == pytest.approx((1.5 + 0.8 + 1.1) / 3, rel=1e-6)
    assert float(out.clip_fraction_low) == pytest.approx(1 / 3)
    assert float(out.clip_fraction_high) == 0.0
    assert float(out.ratio_max) == pytest.approx(1.5, rel=1e-6)
    assert float(out.ratio_min) == pytest.approx(0.5, rel=1e-6)


def test_first_on_policy_iteration_has_ratio_exactly_one():
    logprobs = jnp.log(jax.random.uniform(jax.random.key(0), (4, 6), minval=0.05, maxval=1.0))
    mask = grpo.mask_after_eos(jax.random.randint(jax.random.key(1), (4, 6), 0, 4), (0,))
    advantages = jnp.array([1.0, -1.0, 0.5, -0.5])
    out = grpo.grpo_loss(logprobs, logprobs, advantages, mask, epsilon=0.2, epsilon_high=0.28)
    assert float(out.ratio_mean) == 1.0 and float(out.ratio_max) == 1.0 and float(out.ratio_min) == 1.0
    assert float(out.clip_fraction_low) == 0.0 and float(out.clip_fraction_high) == 0.0
    assert float(out.approx_kl_behaviour) == 0.0
    expected = -float((advantages[:, None] * mask).sum() / mask.sum())
    assert float(out.loss) == pytest.approx(expected, rel=1e-6)


def test_post_eos_tokens_never_contribute():
    tokens = jnp.array([[3, 1, 0, 3, 3], [3, 3, 3, 0, 1]])
    mask = grpo.mask_after_eos(tokens, (0,))
    behaviour = jnp.full((2, 5), -1.0)
    logprobs = jnp.full((2, 5), -0.9)
    # Garbage after EOS: huge log-prob differences that would dominate the loss if they counted.
    garbage = logprobs.at[0, 3:].set(30.0).at[1, 4].set(-50.0)
    args = dict(advantages=jnp.array([1.0, -2.0]), mask=mask, beta=0.5, reference_logprobs=jnp.full((2, 5), -1.2))
    clean = grpo.grpo_loss(logprobs, behaviour, **args)
    dirty = grpo.grpo_loss(garbage, behaviour, **args)
    for name, a, b in zip(clean._fields, clean, dirty):
        assert float(a) == float(b), name
    grads = jax.grad(lambda lp: grpo.grpo_loss(lp, behaviour, **args).loss)(garbage)
    assert float(jnp.abs(grads * (1 - mask)).max()) == 0.0


def test_k3_kl_to_reference_hand_example_and_beta_is_applied():
    logprobs = jnp.log(jnp.array([[0.5]]))
    reference = jnp.log(jnp.array([[0.25]]))
    expected_kl = 0.5 - math.log(0.5) - 1.0  # r - log r - 1 with r = 0.25 / 0.5
    assert float(grpo.k3_kl(logprobs, reference)[0, 0]) == pytest.approx(expected_kl, rel=1e-6)
    base = grpo.grpo_loss(logprobs, logprobs, jnp.array([1.0]), jnp.ones((1, 1)))
    with_kl = grpo.grpo_loss(logprobs, logprobs, jnp.array([1.0]), jnp.ones((1, 1)), beta=0.1,
                             reference_logprobs=reference)
    assert float(with_kl.kl_to_reference) == pytest.approx(expected_kl, rel=1e-6)
    assert float(with_kl.loss - base.loss) == pytest.approx(0.1 * expected_kl, rel=1e-5)
    with pytest.raises(ValueError, match="reference"):
        grpo.grpo_loss(logprobs, logprobs, jnp.array([1.0]), jnp.ones((1, 1)), beta=0.1)


def test_approx_kl_behaviour_hand_example():
    behaviour = jnp.log(jnp.array([[0.5, 0.5]]))
    logprobs = jnp.log(jnp.array([[0.25, 0.5]]))
    out = grpo.grpo_loss(logprobs, behaviour, jnp.array([0.0]), jnp.ones((1, 2)))
    # r = 0.5 on the first token, 1 on the second: k3 = (0.5 - 1 - log 0.5 + 0) / 2.
    assert float(out.approx_kl_behaviour) == pytest.approx((0.5 - 1 - math.log(0.5)) / 2, rel=1e-6)


def test_entropy_exact_and_estimated():
    logits = jnp.zeros((1, 2, 4)).at[0, 1].set(jnp.array([0.0, 0.0, -1e9, -1e9]))
    mask = jnp.array([[1, 1]])
    assert float(grpo.entropy_from_logits(logits, mask)) == pytest.approx((math.log(4) + math.log(2)) / 2)
    sampled = jnp.array([[math.log(0.25), math.log(0.5)]])
    assert float(grpo.entropy_from_logprobs(sampled, mask)) == pytest.approx((math.log(4) + math.log(2)) / 2)
    assert float(grpo.entropy_from_logits(logits, jnp.array([[1, 0]]))) == pytest.approx(math.log(4))


def test_logprob_mismatch_hand_example():
    learner = jnp.array([[-1.0, -2.0, -3.0]])
    sampler = jnp.array([[-1.1, -2.0, -9.0]])
    out = grpo.logprob_mismatch(learner, sampler, jnp.array([[1, 1, 0]]))
    assert float(out["logprob_mismatch_mean"]) == pytest.approx(0.05, rel=1e-5)
    assert float(out["logprob_mismatch_max"]) == pytest.approx(0.1, rel=1e-5)
    r = math.exp(0.1)  # learner / sampler on the first token
    assert float(out["kl_sampler_learner"]) == pytest.approx((r - 0.1 - 1) / 2, rel=1e-4)
