"""Bootstrap intervals: coverage of the estimate, shrinking with n, paired differences, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from vlmgym.stats import bootstrap
from vlmgym.stats.bootstrap import Statistic, bootstrap_intervals, paired_bootstrap_intervals


def scores(n, seed=0, shift=0.0):
    """Skewed per-sample values (like distances) with a known generator."""
    return np.random.default_rng(seed).exponential(1.0, size=n) + shift


def test_interval_contains_the_estimate_for_each_kind():
    values = scores(300)
    hits = (values < 1.0).astype(float)
    stats = {"mean": Statistic("mean", values), "median": Statistic("median", values),
             "ratio": Statistic("ratio", hits, np.ones_like(hits))}
    intervals = bootstrap_intervals(stats, n_resamples=500, seed=1)
    assert intervals["mean"].estimate == pytest.approx(values.mean())
    assert intervals["median"].estimate == pytest.approx(np.median(values))
    assert intervals["ratio"].estimate == pytest.approx(hits.mean())
    for interval in intervals.values():
        assert interval.low < interval.estimate < interval.high


def test_mean_interval_matches_the_normal_approximation():
    values = scores(2000)
    interval = bootstrap_intervals({"mean": Statistic("mean", values)}, n_resamples=2000, seed=0)["mean"]
    standard_error = values.std(ddof=1) / np.sqrt(values.size)
    assert interval.high - interval.low == pytest.approx(2 * 1.96 * standard_error, rel=0.1)


def test_interval_shrinks_with_more_samples():
    widths = []
    for n in (50, 500, 5000):
        interval = bootstrap_intervals({"m": Statistic("mean", scores(n))}, n_resamples=400, seed=0)["m"]
        widths.append(interval.high - interval.low)
    assert widths[0] > 2 * widths[1] > 4 * widths[2]


def test_deterministic_for_a_seed_and_different_across_seeds():
    stats = {"m": Statistic("mean", scores(100)), "md": Statistic("median", scores(100, seed=3))}
    first = bootstrap_intervals(stats, n_resamples=300, seed=7)
    assert first == bootstrap_intervals(stats, n_resamples=300, seed=7)
    assert first != bootstrap_intervals(stats, n_resamples=300, seed=8)


def test_chunked_resampling_gives_the_same_answer_shape(monkeypatch):
    stats = {"m": Statistic("mean", scores(1000))}
    whole = bootstrap_intervals(stats, n_resamples=300, seed=0)["m"]
    monkeypatch.setattr(bootstrap, "_MAX_CHUNK_ELEMENTS", 7_000)  # 7 resamples per chunk
    chunked = bootstrap_intervals(stats, n_resamples=300, seed=0)["m"]
    assert chunked.estimate == whole.estimate
    assert chunked.low == pytest.approx(whole.low, abs=0.03) and chunked.high == pytest.approx(whole.high, abs=0.03)


def test_paired_difference_excludes_zero_for_a_clearly_better_policy():
    control = scores(200)
    treatment = control * 0.8  # better (lower distance) on every sample
    diff = paired_bootstrap_intervals({"m": Statistic("mean", treatment)}, {"m": Statistic("mean", control)},
                                      n_resamples=500, seed=0)["m"]
    assert diff.estimate == pytest.approx(treatment.mean() - control.mean())
    assert diff.low < diff.estimate < diff.high < 0


def test_paired_difference_includes_zero_for_equal_policies():
    values = scores(200)
    identical = paired_bootstrap_intervals({"m": Statistic("mean", values)}, {"m": Statistic("mean", values)},
                                           n_resamples=200, seed=0)["m"]
    assert (identical.estimate, identical.low, identical.high) == (0.0, 0.0, 0.0)
    swapped = values[::-1].copy()  # the same answers given to other samples: equal quality, not identical
    diff = paired_bootstrap_intervals({"m": Statistic("mean", swapped)}, {"m": Statistic("mean", values)},
                                      n_resamples=500, seed=0)["m"]
    assert diff.estimate == pytest.approx(0.0, abs=1e-12)
    assert diff.low < 0 < diff.high


def test_pairing_is_tighter_than_independent_intervals_for_correlated_samples():
    control = scores(300)
    treatment = control - 0.05 + np.random.default_rng(5).normal(0, 0.01, size=300)
    diff = paired_bootstrap_intervals({"m": Statistic("mean", treatment)}, {"m": Statistic("mean", control)},
                                      n_resamples=500, seed=0)["m"]
    single = bootstrap_intervals({"m": Statistic("mean", control)}, n_resamples=500, seed=0)["m"]
    assert diff.high < 0
    assert diff.high - diff.low < 0.2 * (single.high - single.low)


def test_ratio_with_no_scorable_resample_is_nan_not_zero():
    hits, scored = np.array([1.0, 0.0, 0.0]), np.array([1.0, 0.0, 0.0])
    interval = bootstrap_intervals({"r": Statistic("ratio", hits, scored)}, n_resamples=200, seed=0)["r"]
    assert interval.estimate == 1.0 and interval.low == 1.0 and interval.high == 1.0
    empty = bootstrap_intervals({"r": Statistic("ratio", np.zeros(3), np.zeros(3))}, n_resamples=20)["r"]
    assert np.isnan(empty.estimate) and np.isnan(empty.low)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="kind"):
        Statistic("mode", np.ones(3))
    with pytest.raises(ValueError, match="denominator"):
        Statistic("ratio", np.ones(3))
    with pytest.raises(ValueError, match="same samples"):
        bootstrap_intervals({"a": Statistic("mean", np.ones(3)), "b": Statistic("mean", np.ones(4))})
    with pytest.raises(ValueError, match="zero samples"):
        bootstrap_intervals({"a": Statistic("mean", np.ones(0))})
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_intervals({"a": Statistic("mean", np.ones(3))}, confidence=95)
