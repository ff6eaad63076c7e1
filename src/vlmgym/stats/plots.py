"""Plot data for DVC (the training reward curves; envs add their own, e.g. a distance CDF) and the same
figures as PNGs for MLflow, with the helpers the envs' plots share."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vlmgym.runtime.atomic import atomic_file

# One colour per policy, in the order given, shared by the PNGs and the HTML maps.
POLICY_COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")

Curve = Sequence[tuple[int, float]]  # (training step, value) pairs


@dataclass(frozen=True)
class RewardCurves:
    """A training run's reward per step: the weighted total (eval.reward_curve_metric: by default at the
    curriculum's final weights, a fixed yardstick), the total as trained (at each step's weights) when that is a
    different curve, and, for an env whose reward has levels (Env.reward_levels), each level's unweighted score
    and its weight in the total."""

    total: Curve = ()
    as_trained: Curve = ()
    levels: Mapping[str, Curve] = field(default_factory=dict)
    weights: Mapping[str, Curve] = field(default_factory=dict)
    # validation during training (vlmgym.rl.validation): "greedy" / "sampled" mean reward on the val split at the
    # final weights, every val_every steps from step 0
    validation: Mapping[str, Curve] = field(default_factory=dict)


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


def level_curve_rows(curves: RewardCurves) -> list[dict]:
    """Rows {step, <level>..., <level>_weight...} of the per-level curves, by step ("" where a curve lacks one)."""
    return curve_table({**curves.levels, **{f"{level}_weight": c for level, c in curves.weights.items()}})


def curve_table(columns: Mapping[str, Curve]) -> list[dict]:
    """Rows {step, <column>...} of several curves joined on their steps ("" where a curve lacks one)."""
    by_column = {name: {row["step"]: row["reward"] for row in reward_curve_rows(c)} for name, c in columns.items()}
    steps = sorted({step for values in by_column.values() for step in values})
    return [{"step": step, **{name: values.get(step, "") for name, values in by_column.items()}} for step in steps]


def write_level_curves_csv(path: str | Path, curves: RewardCurves) -> list[dict]:
    """Write the per-level training curves (columns step, each level, each level's weight) for `dvc plots`."""
    rows = level_curve_rows(curves)
    write_csv(path, ["step", *curves.levels, *(f"{level}_weight" for level in curves.weights)], rows)
    return rows


def write_validation_csv(path: str | Path, curves: RewardCurves) -> list[dict]:
    """Write the validation curves (columns step, greedy, sampled) for `dvc plots`."""
    rows = curve_table(curves.validation)
    write_csv(path, ["step", *curves.validation], rows)
    return rows


def best_validation(curves: RewardCurves) -> tuple[int, float] | None:
    """The (step, reward) the trainer's `select: best_val` keeps: the first step with the highest greedy reward."""
    greedy = reward_curve_rows(curves.validation.get("greedy", ()))
    best = max(greedy, key=lambda row: row["reward"], default=None)  # max keeps the first of equals
    return None if best is None else (best["step"], best["reward"])


def smoothing_window(points: int) -> int:
    """Steps in the trailing mean drawn over a noisy curve: about a tenth of the run (1: no smoothing)."""
    return max(1, points // 10)


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """The mean of each value and the `window - 1` before it (fewer at the start)."""
    sums = [0.0]
    for value in values:
        sums.append(sums[-1] + value)
    return [(sums[i + 1] - sums[max(0, i + 1 - window)]) / (i + 1 - max(0, i + 1 - window))
            for i in range(len(values))]


def _draw(axis, curve: Curve, label: str | None, colour: str) -> None:
    rows = reward_curve_rows(curve)
    steps, values = [r["step"] for r in rows], [r["reward"] for r in rows]
    window = smoothing_window(len(rows))
    if window == 1:
        axis.plot(steps, values, label=label, color=colour, marker="." if len(rows) < 50 else None)
        return
    # one step's mean is over a handful of samples: the raw curve stays faint under its trailing mean
    axis.plot(steps, values, color=colour, alpha=0.25, linewidth=0.8)
    axis.plot(steps, trailing_mean(values, window), label=label, color=colour, linewidth=1.8)


def plot_reward_curve_png(path: str | Path, curves: RewardCurves | Curve) -> None:
    """The training reward as a PNG: the weighted total, then (when given) each level's unweighted score and the
    levels' weights side by side, so a total that falls while the weights move to harder levels reads as that."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not isinstance(curves, RewardCurves):
        curves = RewardCurves(total=curves)
    panels = 1 + bool(curves.levels) + bool(curves.weights)
    figure, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.8), squeeze=False)
    axes = list(axes[0])
    try:
        if curves.as_trained:
            _draw(axes[0], curves.total, "at the final weights", POLICY_COLOURS[1])
            _draw(axes[0], curves.as_trained, "as trained (the step's weights)", POLICY_COLOURS[0])
            axes[0].legend(fontsize="small")
        else:
            _draw(axes[0], curves.total, "train samples" if curves.validation else None, POLICY_COLOURS[1])
        for i, (kind, curve) in enumerate(curves.validation.items()):
            rows = reward_curve_rows(curve)
            axes[0].plot([r["step"] for r in rows], [r["reward"] for r in rows], label=f"val split, {kind}",
                         color=POLICY_COLOURS[(3 + i) % len(POLICY_COLOURS)], marker="o", markersize=3.5)
        best = best_validation(curves)
        if best is not None:
            axes[0].axvline(best[0], color="grey", linestyle=":", linewidth=1.0, label=f"best val (step {best[0]})")
        if curves.validation:
            axes[0].legend(fontsize="small")
        axes[0].set(xlabel="training step", ylabel="mean reward", title="Training reward (weighted total)")
        colours = {level: POLICY_COLOURS[(i + 2) % len(POLICY_COLOURS)] for i, level in enumerate(curves.levels)}
        colours.update({level: POLICY_COLOURS[(i + 2) % len(POLICY_COLOURS)]
                        for i, level in enumerate(curves.weights) if level not in colours})
        if curves.levels:
            axis = axes[1]
            for level, curve in curves.levels.items():
                _draw(axis, curve, level, colours[level])
            axis.set(xlabel="training step", ylabel="mean score", title="Each level, unweighted")
            axis.legend(fontsize="small")
            # the same scale as the total, so the two read against each other
            low = min(min(a.get_ylim()[0] for a in axes[:2]), 0.0)
            high = max(a.get_ylim()[1] for a in axes[:2])
            for a in axes[:2]:
                a.set_ylim(low, high)
        if curves.weights:
            axis = axes[-1]
            for i, (level, curve) in enumerate(curves.weights.items()):
                rows = reward_curve_rows(curve)
                # levels often share a weight: a line style each keeps the ones drawn over still visible
                axis.plot([r["step"] for r in rows], [r["reward"] for r in rows], label=level, color=colours[level],
                          linestyle=("-", "--", "-.", ":")[i % 4], linewidth=1.6)
            axis.set(xlabel="training step", ylabel="share of the total", title="Level weights (curriculum)")
            axis.legend(fontsize="small")
        if len(curves.total) > 1 and smoothing_window(len(curves.total)) > 1:
            figure.text(0.01, -0.02, f"Bold: mean of the last {smoothing_window(len(curves.total))} steps; "
                        "faint: each step.", fontsize="small")
        save_figure(figure, path)
    finally:
        plt.close(figure)
