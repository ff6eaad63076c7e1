"""The two-level (seeds, then samples) bootstrap of vlmgym.eval.seed_bootstrap, against the one-level bootstrap
and hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from vlmgym.eval.seed_bootstrap import seed_bootstrap_intervals, seed_points
from vlmgym.stats.bootstrap import Statistic, bootstrap_intervals, paired_bootstrap_intervals


def stats(values, hits=None):
    out = {"mean_reward": Statistic("mean", np.asarray(values, dtype=float))}
    if hits is not None:
        out["accuracy"] = Statistic("ratio", np.asarray(hits, dtype=float), np.ones(len(hits)))
    return out


def test_one_seed_is_exactly_the_sample_bootstrap():
    rng = np.random.default_rng(3)
    treatment = stats(rng.random(37), rng.random(37) < 0.4)
    control = stats(rng.random(37), rng.random(37) < 0.5)
    assert seed_bootstrap_intervals([treatment], n_resamples=300, seed=5) == bootstrap_intervals(
        treatment, n_resamples=300, seed=5)
    assert seed_bootstrap_intervals([treatment], [control], n_resamples=300, seed=5) == paired_bootstrap_intervals(
        treatment, control, n_resamples=300, seed=5)


def test_constant_seeds_by_hand():
    # No sample variance: a resample's mean is the mean of two seeds drawn from {0, 1}, so 0, 0.5 or 1 with
    # probability 1/4, 1/2, 1/4; the 2.5% and 97.5% percentiles are 0 and 1, the estimate 0.5.
    result = seed_bootstrap_intervals([stats(np.zeros(10)), stats(np.ones(10))], n_resamples=2000, seed=0)
    interval = result["mean_reward"]
    assert (interval.estimate, interval.low, interval.high) == (0.5, 0.0, 1.0)


def test_a_constant_shift_between_seeds_widens_the_interval_to_cover_the_spread():
    base = np.random.default_rng(0).random(50) * 0.1
    per_seed = [stats(base + shift) for shift in (0.0, 1.0, 2.0)]
    one = bootstrap_intervals(per_seed[0], n_resamples=1000, seed=0)["mean_reward"]
    three = seed_bootstrap_intervals(per_seed, n_resamples=1000, seed=0)["mean_reward"]
    assert three.estimate == pytest.approx(base.mean() + 1.0)
    assert three.high - three.low > 10 * (one.high - one.low)
    # All three seeds drawn as the lowest (or highest) has probability 1/27 > 2.5%: the ends reach the extremes.
    assert three.low < base.mean() + 0.1 and three.high > base.mean() + 1.9
    assert seed_points(per_seed, "mean_reward") == pytest.approx([base.mean(), base.mean() + 1, base.mean() + 2])


def test_paired_differences_cancel_a_shift_shared_by_a_seeds_arm_and_control():
    base = np.random.default_rng(1).random(40)
    control = [stats(base + shift) for shift in (0.0, 3.0)]
    treatment = [stats(base + shift + 0.25) for shift in (0.0, 3.0)]
    interval = seed_bootstrap_intervals(treatment, control, n_resamples=500, seed=0)["mean_reward"]
    assert (interval.estimate, interval.low, interval.high) == pytest.approx((0.25, 0.25, 0.25))
    unpaired = seed_bootstrap_intervals(treatment, n_resamples=500, seed=0)["mean_reward"]
    assert unpaired.high - unpaired.low > 2.0


def test_deterministic_given_its_seed():
    rng = np.random.default_rng(2)
    per_seed = [stats(rng.random(20), rng.random(20) < 0.5) for _ in range(3)]
    first = seed_bootstrap_intervals(per_seed, n_resamples=200, seed=7)
    assert seed_bootstrap_intervals(per_seed, n_resamples=200, seed=7) == first
    assert seed_bootstrap_intervals(per_seed, n_resamples=200, seed=8) != first


def test_mismatched_seeds_are_refused():
    with pytest.raises(ValueError, match="control seeds"):
        seed_bootstrap_intervals([stats([1.0])], [stats([1.0]), stats([0.0])])
    with pytest.raises(ValueError, match="zero seeds"):
        seed_bootstrap_intervals([])
