"""The study report's text and plot: its differences table (the t-interval as the interval, the two-level bootstrap
beside it, bold where the t-interval excludes 0), every metric per split, every seed's mean reward, and where each
run ended."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vlmgym.compare.seeds import HEADLINE

Results = Mapping[str, Mapping[str, Mapping[str, float]]]  # split -> policy or difference -> flat figures


def shown(name: str) -> str:
    """A difference's key as the tables show it: grpo_minus_sft -> grpo - sft."""
    return name.replace("_minus_", " - ")


def excludes_zero(flat: Mapping[str, float]) -> bool:
    """Whether the t-interval (several seeds' `_ci_`, which a `_boot_` interval beside marks) excludes 0."""
    low, high = flat.get(f"{HEADLINE}_ci_low", math.nan), flat.get(f"{HEADLINE}_ci_high", math.nan)
    return f"{HEADLINE}_boot_low" in flat and (low > 0 or high < 0)


def _interval(low: float | None, high: float | None) -> str:
    from vlmgym.eval.report import format_value

    return f"[{format_value(low, 'reward', True)}, {format_value(high, 'reward', True)}]"


def differences_table(results: Results, confidence: float) -> str:
    """Markdown: every difference on every split, its mean over seeds, t-interval, bootstrap interval and seeds."""
    from vlmgym.eval.report import format_value

    level = f"{100 * confidence:.0f}%"
    lines = [f"| difference | split | mean | {level} t-interval (seeds) | {level} two-level bootstrap | seeds |",
             "|---|---|---|---|---|---|"]
    names = [name for name in next(iter(results.values())) if "_minus_" in name]
    for name in names:
        for split, split_results in results.items():
            flat = split_results[name]
            several = f"{HEADLINE}_boot_low" in flat
            mean = format_value(flat[HEADLINE], "reward", True)
            t = _interval(flat[f"{HEADLINE}_ci_low"], flat[f"{HEADLINE}_ci_high"]) if several else "n/a (1 seed)"
            boot = (_interval(flat[f"{HEADLINE}_boot_low"], flat[f"{HEADLINE}_boot_high"]) if several
                    else _interval(flat[f"{HEADLINE}_ci_low"], flat[f"{HEADLINE}_ci_high"]) + " (test samples)")
            if excludes_zero(flat):
                mean, t = f"**{mean}**", f"**{t}**"
            lines.append(f"| {shown(name)} | {split} | {mean} | {t} | {boot} | {int(flat.get('seeds', 1))} |")
    return "\n".join(lines) + "\n"


def metrics_table(env: Any, results: Mapping[str, Mapping[str, float]], confidence: float, seeds: int) -> str:
    """Markdown: every metric of the env (rows) for every policy and difference (columns), mean over seeds with its
    interval."""
    from vlmgym.eval.report import summary_rows

    header, rows = summary_rows(env, results)
    lines = ["| " + " | ".join(shown(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    what = (f"{100 * confidence:.0f}% t-interval over the {seeds} seeds" if seeds > 1
            else f"{100 * confidence:.0f}% percentile bootstrap over test samples (one seed)")
    return "\n".join(lines) + f"\n\nMeans over seeds [{what}]; `a - b` columns are paired differences.\n"


def endings_table(training: Mapping[str, Mapping[int, Mapping[str, float]]], seeds: Sequence[int]) -> str:
    """Markdown: the step each run's model comes from (what validation selected) of its steps, per seed."""
    lines = ["| run | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for name, by_seed in training.items():
        cells = []
        for seed in seeds:
            steps, step = by_seed[seed]["steps"], by_seed[seed].get("selected_step")
            cells.append(f"{steps:.0f} steps" if step is None else f"step {step:.0f} of {steps:.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(path: Path, results: Results, policies: Sequence[str], confidence: float, seeds: int) -> None:
    """Per split: each policy's mean reward and each difference, with the report's interval (t over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vlmgym.stats.plots import POLICY_COLOURS, save_figure

    figure, axes = plt.subplots(len(results), 2, figsize=(11, 3.4 * len(results)), squeeze=False)
    interval = f"{100 * confidence:.0f}% " + ("t-interval" if seeds > 1 else "bootstrap")
    try:
        for row, (split, split_results) in enumerate(results.items()):
            differences = [k for k in split_results if "_minus_" in k]
            for column, (keys, title) in enumerate(((list(policies), f"{split}: mean reward"),
                                                    (differences, f"{split}: paired differences"))):
                axis = axes[row][column]
                values = [split_results[k][HEADLINE] for k in keys]
                low = [split_results[k][HEADLINE] - split_results[k][f"{HEADLINE}_ci_low"] for k in keys]
                high = [split_results[k][f"{HEADLINE}_ci_high"] - split_results[k][HEADLINE] for k in keys]
                colours = [POLICY_COLOURS[i % len(POLICY_COLOURS)] for i in range(len(keys))]
                axis.bar(range(len(keys)), values, yerr=[low, high], color=colours, capsize=4)
                axis.set_xticks(range(len(keys)), [shown(k) for k in keys], rotation=20, fontsize="small")
                axis.axhline(0, color="grey", linewidth=0.8)
                axis.set_title(f"{title} [{seeds} seed{'s' if seeds > 1 else ''}, {interval}]", fontsize="medium")
        figure.tight_layout()
        save_figure(figure, path)
    finally:
        plt.close(figure)
