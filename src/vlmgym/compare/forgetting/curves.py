"""The figures of a forgetting study, from per-seed values: each method's curve of new-skill gain against old-skill
change, the old-skill change at matched new-skill gain, and how well the KL to the generalist predicts forgetting.

Every figure is a mean over seeds with the paired per-seed t-interval (vlmgym.stats.seed_interval): a seed's value
is already a difference from that seed's own generalist (gain: the point's new-skill reward minus the
generalist's; change: the same on the old skills), so the interval holds the run-to-run variance of both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vlmgym.stats.seed_interval import seed_t_interval

Curve = Sequence[tuple[float, float]]  # (gain, change) points of one method on one seed
MATCHED_FRACTIONS = (1 / 3, 2 / 3, 1.0)  # the matched gains: these shares of the largest gain every curve reaches


def interval(values: Sequence[float], confidence: float) -> dict[str, Any]:
    """{"mean", "ci_low", "ci_high", "values"}: the t-interval over seeds (low and high None for one seed, or
    where a value is missing)."""
    values = [float(v) for v in values]
    if not values or any(math.isnan(v) for v in values):
        return {"mean": None, "ci_low": None, "ci_high": None, "values": [_plain(v) for v in values]}
    t = seed_t_interval(values, confidence)
    return {"mean": float(np.mean(values)), "ci_low": None if t is None else t.low,
            "ci_high": None if t is None else t.high, "values": values}


def _plain(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def along(curve: Curve, gain: float) -> float:
    """The change at `gain` along a curve: linear between its points sorted by gain; nan outside their range."""
    points = sorted(curve)
    gains = np.array([g for g, _ in points])
    if not len(points) or gain < gains.min() or gain > gains.max():
        return math.nan
    return float(np.interp(gain, gains, [c for _, c in points]))


def matched_gains(curves: Mapping[str, Sequence[Curve]]) -> list[float]:
    """Gains every seed's curve of every method reaches (MATCHED_FRACTIONS of the smallest of their largest gains;
    every curve starts at the generalist's 0): empty when some curve gains nothing."""
    reach = min(max(g for g, _ in curve) for by_seed in curves.values() for curve in by_seed)
    return [reach * fraction for fraction in MATCHED_FRACTIONS] if reach > 0 else []


def at_matched_gain(curves: Mapping[str, Sequence[Curve]], control: str, confidence: float) -> list[dict[str, Any]]:
    """At each matched gain: every method's change (interpolated along each seed's curve) and each other method's
    difference from `control`'s, paired by seed, with their t-intervals."""
    rows = []
    for gain in matched_gains(curves):
        changes = {method: [along(curve, gain) for curve in by_seed] for method, by_seed in curves.items()}
        row: dict[str, Any] = {"gain": gain, **{method: interval(v, confidence) for method, v in changes.items()}}
        for method in changes:
            if method != control and control in changes:
                row[f"{method}_minus_{control}"] = interval(
                    [a - b for a, b in zip(changes[method], changes[control], strict=True)], confidence)
        rows.append(row)
    return rows


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r; nan when either has no spread or fewer than 3 points."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def fisher_interval(r: float, n: int, confidence: float) -> tuple[float, float]:
    """The Fisher z-interval of a Pearson r over n independent pairs (nan below 4 pairs or at |r| = 1)."""
    from scipy.stats import norm

    if math.isnan(r) or n < 4 or abs(r) >= 1:
        return math.nan, math.nan
    half = float(norm.ppf((1 + confidence) / 2)) / math.sqrt(n - 3)
    z = math.atanh(r)
    return math.tanh(z - half), math.tanh(z + half)


def kl_predicts(kl_by_seed: Sequence[Sequence[float]], forgetting_by_seed: Sequence[Sequence[float]],
                confidence: float) -> dict[str, Any]:
    """How well the KL predicts forgetting over every run (each seed's sweep points, both methods): Pearson's r of
    all runs pooled with its Fisher z-interval (which takes the runs as independent: those of one seed share its
    generalist), and each seed's own r with the t-interval over seeds (the interval that respects the pairing)."""
    kl = [v for seed in kl_by_seed for v in seed]
    forgetting = [v for seed in forgetting_by_seed for v in seed]
    r = pearson(kl, forgetting)
    low, high = fisher_interval(r, len(kl), confidence)
    per_seed = [pearson(k, f) for k, f in zip(kl_by_seed, forgetting_by_seed, strict=True)]
    slope = float(np.polyfit(kl, forgetting, 1)[0]) if len(kl) > 1 and np.std(kl) > 0 else math.nan
    return {"pooled_r": _plain(r), "pooled_ci_low": _plain(low), "pooled_ci_high": _plain(high), "runs": len(kl),
            "slope": _plain(slope), "per_seed_r": interval(per_seed, confidence)}
