"""A t-interval over training seeds: the interval to report when a claim rests on a few seeds.

Each seed (a full training run answering the same test samples) gives one point value: its statistic, or for a
comparison its treatment statistic minus the same seed's control statistic on that seed's samples (a paired
difference). With n such values the interval is mean ± t_{n-1, (1+confidence)/2} · sd / sqrt(n), sd the sample
standard deviation (ddof=1). It keeps its nominal coverage at 3 to 10 seeds for roughly normal seed effects, where a
percentile bootstrap over the same seeds is too narrow (about 75% for a nominal 95% at 3 seeds, 90% at 10:
tests/stats/test_seed_interval.py measures both). Each seed's value already holds that seed's sample noise, so the
between-seed spread covers both variances; the seeds share base initialisation, dataset and test set, so the
interval is conditional on those.

One seed has no between-seed spread: `seed_t_interval` then returns None, and the caller falls back to the sample
bootstrap of that seed (vlmgym.stats.bootstrap), which is all that one run can say.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import t as student_t

from vlmgym.stats.bootstrap import Interval


def t_quantile(probability: float, df: int) -> float:
    """The `probability` quantile of Student's t with `df` degrees of freedom (t_{2, 0.975} = 4.303)."""
    if df < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, got {df}")
    if not 0.0 < probability < 1.0:
        raise ValueError(f"a quantile's probability must be in (0, 1), got {probability}")
    return float(student_t.ppf(probability, df))


def seed_t_interval(points: Sequence[float], confidence: float = 0.95) -> Interval | None:
    """Mean of the per-seed `points` with its t-interval, or None for a single seed (no between-seed spread to
    estimate: fall back to that seed's sample bootstrap). Zero points raise ValueError. Seeds that all agree give
    the zero-width interval [mean, mean]; a non-finite point (a ratio with no scorable sample) makes the whole
    interval nan, as the seeds' mean is."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    values = np.asarray(points, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"points must be one value per seed, got shape {values.shape}")
    n = len(values)
    if n == 0:
        raise ValueError("cannot build an interval over zero seeds")
    if n == 1:
        return None
    mean = float(values.mean())
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * float(values.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half)
