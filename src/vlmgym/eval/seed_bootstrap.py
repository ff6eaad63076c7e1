"""Two-level (hierarchical) percentile bootstrap over training seeds and test samples, single and paired.

One training run's sample bootstrap says how much its score would move on other test samples, not how much it
would move had training drawn other random numbers. With several seeds (each a full training run answering the
same samples) each resample draws seeds with replacement, then, for every drawn seed, its samples with
replacement, and averages the drawn seeds' statistics: the interval then holds both variances. A paired
difference applies the same sample indices to a seed's treatment and to that seed's control.

With few seeds that percentile interval is too narrow (a nominal 95% covers about 75% at 3 seeds, 90% at 10), so
`seed_t_intervals` gives the interval to report: the t-interval over the seeds' own values (`seed_points`), see
vlmgym.stats.seed_interval; the two-level bootstrap stays beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from vlmgym.stats.bootstrap import Interval, Statistic, _check, _index_chunks, _percentiles
from vlmgym.stats.seed_interval import seed_t_interval


def _names(groups: Sequence[Mapping[str, Statistic]]) -> list[str]:
    return [name for name in groups[0] if all(name in group for group in groups[1:])]


def seed_bootstrap_intervals(per_seed: Sequence[Mapping[str, Statistic]],
                             control: Sequence[Mapping[str, Statistic]] | None = None, *, n_resamples: int = 1000,
                             seed: int = 0, confidence: float = 0.95) -> dict[str, Interval]:
    """Mean over seeds of each statistic (of treatment - control with `control`: one per seed, on that seed's
    samples) with its two-level bootstrap interval. With one seed the draws, hence the interval, are exactly
    `bootstrap_intervals`' (paired: `paired_bootstrap_intervals`') with the same `seed`."""
    if control is not None and len(control) != len(per_seed):
        raise ValueError(f"{len(per_seed)} treatment seeds but {len(control)} control seeds")
    if not per_seed:
        raise ValueError("cannot bootstrap zero seeds")
    names = _names([*per_seed, *(control or [])])
    if not names:
        return {}
    n_seeds = len(per_seed)
    # (resamples, slots) draws per seed: slot i of resample r uses seed k's row r * n_seeds + i, so a seed drawn
    # twice into one resample gets two independent sample resamples (and one seed uses rows 0..R-1 in order, as
    # the one-level bootstrap does).
    draws: list[dict[str, np.ndarray]] = []
    for k, treatment in enumerate(per_seed):
        both = {**{f"t:{n}": treatment[n] for n in names},
                **({f"c:{n}": control[k][n] for n in names} if control is not None else {})}
        n_samples = _check(both, n_resamples, confidence)
        chunks: dict[str, list[np.ndarray]] = {name: [] for name in names}
        for indices in _index_chunks(n_samples, n_resamples * n_seeds, seed + k):
            for name in names:
                value = treatment[name].on(indices)
                chunks[name].append(value if control is None else value - control[k][name].on(indices))
        draws.append({name: np.concatenate(c).reshape(n_resamples, n_seeds) for name, c in chunks.items()})
    # Its own stream (seed + k feeds seed k's samples); one seed is always drawn as itself.
    chosen = np.random.default_rng([seed, n_seeds]).integers(0, n_seeds, size=(n_resamples, n_seeds))
    slots = np.arange(n_seeds)[None, :]
    out = {}
    for name in names:
        stacked = np.stack([d[name] for d in draws])  # (seeds, resamples, slots)
        resampled = stacked[chosen, np.arange(n_resamples)[:, None], slots].mean(axis=1)
        low, high = _percentiles(resampled, confidence)
        out[name] = Interval(float(np.mean(seed_points(per_seed, name, control))), low, high)
    return out


def seed_points(per_seed: Sequence[Mapping[str, Statistic]], name: str,
                control: Sequence[Mapping[str, Statistic]] | None = None) -> list[float]:
    """Each seed's own value of statistic `name` (minus that seed's control's with `control`)."""
    return [s[name].point() - (control[k][name].point() if control is not None else 0.0)
            for k, s in enumerate(per_seed)]


def seed_t_intervals(per_seed: Sequence[Mapping[str, Statistic]],
                     control: Sequence[Mapping[str, Statistic]] | None = None, *,
                     confidence: float = 0.95) -> dict[str, Interval]:
    """Mean over seeds of each statistic (of treatment - control with `control`: one per seed, on that seed's
    samples) with the t-interval over the seeds' values (vlmgym.stats.seed_interval.seed_t_interval), for the
    statistics `seed_bootstrap_intervals` gives, with the same estimates. One seed has no between-seed interval:
    the result is then {}, so `seed_t_intervals(...) or seed_bootstrap_intervals(...)` falls back to that seed's
    sample bootstrap. Zero seeds, or treatment and control seed counts that differ, raise ValueError."""
    if control is not None and len(control) != len(per_seed):
        raise ValueError(f"{len(per_seed)} treatment seeds but {len(control)} control seeds")
    if not per_seed:
        raise ValueError("cannot build an interval over zero seeds")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    names = _names([*per_seed, *(control or [])])
    if len(per_seed) == 1 or not names:
        return {}
    for k, treatment in enumerate(per_seed):  # each seed's treatment and control answer the same samples
        _check({**{f"t:{n}": treatment[n] for n in names},
                **({f"c:{n}": control[k][n] for n in names} if control is not None else {})}, 1, confidence)
    out = {}
    for name in names:
        interval = seed_t_interval(seed_points(per_seed, name, control), confidence)
        assert interval is not None  # two or more seeds
        out[name] = interval
    return out
