"""report.png of a forgetting study: per old-skill split, each method's curve of new-skill gain (x) against
old-skill change (y), side by side, each point with its t-intervals on both axes; then every run's KL against its
forgetting."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _errors(figures: list[dict[str, Any]]) -> list[list[float]]:
    """Matplotlib's [below, above] distances of each figure's interval from its mean (0 without one)."""
    below = [0.0 if f["ci_low"] is None else f["mean"] - f["ci_low"] for f in figures]
    above = [0.0 if f["ci_high"] is None else f["ci_high"] - f["mean"] for f in figures]
    return [below, above]


def plot(path: Path, figures: dict[str, Any], confidence: float, seeds: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vlmgym.stats.plots import POLICY_COLOURS, save_figure

    splits, points = figures["splits"], figures["points"]
    methods = list(dict.fromkeys(f["method"] for f in points.values()))
    colour = {m: POLICY_COLOURS[i % len(POLICY_COLOURS)] for i, m in enumerate(methods)}
    interval = f"{100 * confidence:.0f}% t-interval over {seeds} seeds" if seeds > 1 else "1 seed, no interval"
    figure, axes = plt.subplots(1, len(splits) + 1, figsize=(5.2 * (len(splits) + 1), 4.4), squeeze=False)
    try:
        for axis, split in zip(axes[0], splits):
            for method in methods:
                mine = sorted((f for f in points.values() if f["method"] == method and f["gain"]["mean"] is not None
                               and f["change"][split]["mean"] is not None), key=lambda f: f["gain"]["mean"])
                zero = {"mean": 0.0, "ci_low": None, "ci_high": None}  # the generalist: the curve's start
                xs, ys = [zero, *(f["gain"] for f in mine)], [zero, *(f["change"][split] for f in mine)]
                axis.errorbar([x["mean"] for x in xs], [y["mean"] for y in ys], xerr=_errors(xs), yerr=_errors(ys),
                              marker="o", capsize=3, color=colour[method], label=method)
            axis.axhline(0, color="grey", linewidth=0.8)
            axis.axvline(0, color="grey", linewidth=0.8)
            axis.set_xlabel("new-skill gain (mean reward)")
            axis.set_ylabel(f"old-skill change, {split} (mean reward)")
            axis.set_title(f"{split} [{interval}]", fontsize="medium")
            axis.legend(fontsize="small")
        axis = axes[0][-1]
        for method in methods:
            mine = [f for f in points.values() if f["method"] == method]
            pairs = [(k, -c) for f in mine for k, c in zip(f["kl"]["policy_to_generalist"]["values"],
                                                           f["change"][splits[0]]["values"])
                     if k is not None and c is not None]
            axis.scatter([k for k, _ in pairs], [c for _, c in pairs], color=colour[method], label=method, s=18)
        axis.set_xlabel("KL(pi || generalist) on the new skill's prompts (nats)")
        axis.set_ylabel(f"forgetting, {splits[0]} (minus the change)")
        axis.set_title("every run", fontsize="medium")
        axis.legend(fontsize="small")
        figure.tight_layout()
        save_figure(figure, path)
    finally:
        plt.close(figure)
