"""Plot data for DVC (distance CDF per policy, training reward curve) and the same figures as PNGs for MLflow."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from vlmgym.data.layout import atomic_file
from vlmgym.eval.metrics import MISSING_DISTANCE_KM, RADII_KM

# One colour per policy, in the order given, shared by the PNGs and the HTML maps.
POLICY_COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def cdf_grid_km(points: int = 120) -> np.ndarray:
    """Log-spaced distances from 0.1 km to the largest possible one, plus the OSV-5M radii (sorted, unique)."""
    grid = np.geomspace(0.1, math.ceil(MISSING_DISTANCE_KM), points)
    return np.unique(np.concatenate([grid, np.asarray(RADII_KM, dtype=np.float64)]))


def distance_cdf(distances_km: Mapping[str, Sequence[float]], grid_km: np.ndarray | None = None) -> list[dict]:
    """Rows {distance_km, <policy>: share of samples within that distance} on a shared grid."""
    grid = cdf_grid_km() if grid_km is None else np.asarray(grid_km, dtype=np.float64)
    columns = {}
    for policy, values in distances_km.items():
        values = np.sort(np.asarray(values, dtype=np.float64))
        if values.size == 0:
            raise ValueError(f"distance CDF: policy {policy!r} has no distances")
        columns[policy] = np.searchsorted(values, grid, side="right") / values.size
    return [{"distance_km": round(float(x), 4), **{p: round(float(c[i]), 6) for p, c in columns.items()}}
            for i, x in enumerate(grid)]


def _write_csv(path: str | Path, header: list[str], rows: list[dict]) -> None:
    with atomic_file(Path(path)) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def write_distance_cdf_csv(path: str | Path, distances_km: Mapping[str, Sequence[float]]) -> list[dict]:
    """Write the distance CDF (columns distance_km, then one per policy) for `dvc plots`; returns the rows."""
    rows = distance_cdf(distances_km)
    _write_csv(path, ["distance_km", *distances_km], rows)
    return rows


def reward_curve_rows(step_rewards: Sequence[tuple[int, float]]) -> list[dict]:
    """(step, reward) pairs -> rows {step, reward} sorted by step; non-finite rewards are a clear error."""
    rows = []
    for i, pair in enumerate(step_rewards):
        try:
            step, reward = int(pair[0]), float(pair[1])
        except (TypeError, ValueError, IndexError) as error:
            raise ValueError(f"reward curve entry {i} must be (step, reward), got {pair!r}") from error
        if not math.isfinite(reward):
            raise ValueError(f"reward curve entry {i} (step {step}) has a non-finite reward {reward!r}")
        rows.append({"step": step, "reward": reward})
    return sorted(rows, key=lambda row: row["step"])


def write_reward_curve_csv(path: str | Path, step_rewards: Sequence[tuple[int, float]]) -> list[dict]:
    """Write the training reward curve (columns step, reward) for `dvc plots`; returns the rows."""
    rows = reward_curve_rows(step_rewards)
    _write_csv(path, ["step", "reward"], rows)
    return rows


def _save_figure(figure, path: str | Path) -> None:
    with atomic_file(Path(path)) as tmp:
        figure.savefig(tmp, format="png", dpi=110, bbox_inches="tight")


def plot_distance_cdf_png(path: str | Path, distances_km: Mapping[str, Sequence[float]]) -> None:
    """The distance CDF per policy as a PNG (log distance axis, OSV-5M radii marked)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on the pipeline machines
    import matplotlib.pyplot as plt

    rows = distance_cdf(distances_km)
    grid = [row["distance_km"] for row in rows]
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    try:
        for i, policy in enumerate(distances_km):
            axis.plot(grid, [row[policy] for row in rows], label=policy, color=POLICY_COLOURS[i % len(POLICY_COLOURS)])
        for radius in RADII_KM:
            axis.axvline(radius, color="0.85", linewidth=0.8, zorder=0)
        axis.set(xscale="log", xlabel="distance to truth (km)", ylabel="share of test samples within",
                 ylim=(0, 1), title="Distance CDF")
        axis.legend()
        _save_figure(figure, path)
    finally:
        plt.close(figure)


def plot_reward_curve_png(path: str | Path, step_rewards: Sequence[tuple[int, float]]) -> None:
    """The training reward curve as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = reward_curve_rows(step_rewards)
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    try:
        axis.plot([r["step"] for r in rows], [r["reward"] for r in rows], marker="." if len(rows) < 50 else None)
        axis.set(xlabel="training step", ylabel="mean reward", title="Training reward")
        _save_figure(figure, path)
    finally:
        plt.close(figure)
