"""Plot data for DVC (the training reward curve; envs add their own, e.g. a distance CDF) and the same
figures as PNGs for MLflow, with the helpers the envs' plots share."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from vlmgym.atomic import atomic_file

# One colour per policy, in the order given, shared by the PNGs and the HTML maps.
POLICY_COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def write_csv(path: str | Path, header: list[str], rows: list[dict]) -> None:
    """Write rows as a CSV atomically (for `dvc plots`)."""
    with atomic_file(Path(path)) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


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
    write_csv(path, ["step", "reward"], rows)
    return rows


def save_figure(figure, path: str | Path) -> None:
    """Save a matplotlib figure as a PNG atomically."""
    with atomic_file(Path(path)) as tmp:
        figure.savefig(tmp, format="png", dpi=110, bbox_inches="tight")


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
        save_figure(figure, path)
    finally:
        plt.close(figure)
