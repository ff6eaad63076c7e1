"""Online DPO over episodes: a side of a pair spans several rows (one per policy turn), and the coefficient-weighted
row gradients that pair_terms gives are the DPO loss's own gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vlmgym.rl.dpo import dpo_loss, pair_terms

BETA = 0.3


def _rows(seed, count, width=5):
    rng = np.random.default_rng(seed)
    logprobs, reference = rng.normal(-1, 0.5, (count, width)), rng.normal(-1, 0.5, (count, width))
    mask = (rng.random((count, width)) < 0.8).astype(np.float64)
    mask[:, 0] = 1.0
    return logprobs, reference, mask


def test_row_coefficients_are_the_gradient_of_the_dpo_loss_of_whole_trajectories():
    # pair 0: a two-turn chosen episode, a one-turn rejected one; pair 1: one turn against three; pair 2: a tie
    pair = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2])
    sign = np.array([1, 1, -1, 1, -1, -1, -1, 1, -1], np.float32)
    valid = np.array([True, True, False])
    logprobs, reference, mask = _rows(0, len(pair))

    def loss(lp):
        ratios = ((lp - reference) * mask).sum(axis=1)
        logit = jnp.stack([(ratios * (pair == p) * sign).sum() for p in range(3)])
        return (-jax.nn.log_sigmoid(BETA * logit) * valid).sum() / valid.sum()

    sums = lambda x: (x * mask).sum(axis=1)  # noqa: E731
    terms = pair_terms(sums(logprobs), sums(reference), pair, sign, valid, beta=BETA, normalizer=2.0)
    assert terms.loss == pytest.approx(float(loss(jnp.asarray(logprobs))), rel=1e-6)
    expected = np.asarray(jax.grad(loss)(jnp.asarray(logprobs)))
    np.testing.assert_allclose(terms.coefficients[:, None] * mask, expected, rtol=1e-5, atol=1e-7)
    assert (terms.coefficients[:2] < 0).all() and terms.coefficients[2] > 0  # raise the chosen, lower the rejected
    assert (terms.coefficients[7:] == 0).all()  # a tie moves nothing
    logit = sums(logprobs - reference)[:2].sum() - sums(logprobs - reference)[2]
    assert terms.chosen_reward_sum - terms.rejected_reward_sum == pytest.approx(
        terms.margin_sum, rel=1e-9) and terms.accuracy_sum == float(logit > 0) + float(
        sums(logprobs - reference)[3] > sums(logprobs - reference)[4:7].sum())


def test_one_row_a_side_is_the_one_turn_loss():
    logprobs, reference, mask = _rows(1, 6)
    valid = np.array([True, False, True])
    one_turn = dpo_loss(jnp.asarray(logprobs), jnp.asarray(reference), jnp.asarray(mask), jnp.asarray(valid),
                        beta=BETA)
    sums = lambda x: (x * mask).sum(axis=1)  # noqa: E731
    terms = pair_terms(sums(logprobs), sums(reference), np.repeat(np.arange(3), 2), np.tile([1.0, -1.0], 3), valid,
                       beta=BETA, normalizer=2.0)
    assert terms.loss == pytest.approx(float(one_turn.loss), rel=1e-5)
    assert terms.margin_sum == pytest.approx(float(one_turn.margin_sum), rel=1e-5)
    assert terms.accuracy_sum == float(one_turn.accuracy_sum)


def test_extreme_logits_stay_finite():
    terms = pair_terms(np.array([1e4, -1e4, -1e4, 1e4]), np.zeros(4), np.array([0, 0, 1, 1]),
                       np.array([1.0, -1.0, 1.0, -1.0]), np.array([True, True]), beta=1.0, normalizer=2.0)
    assert np.isfinite(terms.loss) and np.isfinite(terms.coefficients).all()
    assert terms.loss == pytest.approx(1e4, rel=1e-6)  # the misordered pair: -log sigmoid(-2e4) / 2
    assert terms.coefficients[0] == 0.0 and terms.coefficients[2] == pytest.approx(-0.5)
