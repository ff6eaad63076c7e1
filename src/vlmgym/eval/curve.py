"""The training curves of the model being evaluated, read from the train stage's curve file.

The train stage writes every step's figures, under the names MLflow gets them, to `metrics/curves/train.jsonl`
(vlmgym.tracking.step_curve), a DVC output of the stage that writes the model folder and a dep of the evaluate
stage: the curves always belong to the evaluated weights, and a clone that `dvc pull`s draws the same report from
the same dvc.lock (no MLflow store needed). A run resumed from a checkpoint writes the same file as an
uninterrupted one.

Each training stage's curve file is also drawn whole, as a PNG beside the report's (write_training_curve_pngs:
`reports/curves_<stage>.png`, one panel per kind of figure: loss, reward, validation reward, KL, entropy), so
`dvc plots show` has images to embed, which need no vega scripts from the network.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vlmgym.stats.plots import POLICY_COLOURS, RewardCurves, save_figure, smoothing_window
from vlmgym.tracking.step_curve import Curve, read_curve

if TYPE_CHECKING:  # for annotations only: importing this module does not load the envs
    from vlmgym.envs.base import Env

# The GRPO trainer's mean reward at each step's curriculum weights (what it optimised then); its
# `final_reward_mean` scores the same samples at the final weights (vlmgym.rl.sampling.sampled_figures).
AS_TRAINED_METRIC = "reward_mean"
# The trainer's validation figures (vlmgym.rl.validation): val/reward_greedy, val/reward_sampled.
VALIDATION_KINDS = ("greedy", "sampled")


def component_metric(component: str) -> str:
    """The MLflow metric the GRPO trainer logs a reward component under: each step's mean over its samples
    (vlmgym.rl.sampling.sampled_figures)."""
    return f"reward/{component}"


def train_curves(curve_file: str | Path, metrics: list[str]) -> dict[str, list[tuple[int, float]]]:
    """{metric: (step, value) pairs} of the train stage's curve file; {} when there is no such file.

    A metric the file does not hold is left out (an env whose reward has no such component)."""
    path = Path(curve_file)
    if not path.is_file():
        return {}
    by_step = read_curve(path)
    curves = {}
    for metric in metrics:
        curve = [(step, figures[metric]) for step, figures in sorted(by_step.items()) if metric in figures]
        if curve:
            curves[metric] = curve
    return curves


def train_reward_curve(curve_file: str | Path, metric: str) -> list[tuple[int, float]]:
    """(step, value) pairs of `metric` in the train stage's curve file; [] if it has none."""
    return train_curves(curve_file, [metric]).get(metric, [])


def reward_curves(env: type[Env], curve_file: str | Path, total_metric: str, *, prefix: str = "") -> RewardCurves:
    """The training reward (`total_metric`), the reward as trained when that is another metric, the validation
    curves when the run validated, and, for an env with reward levels (Env.reward_levels), each level's
    unweighted score and weight per step, from the train stage's curve file; empty if there is none.
    `prefix` reads each of those metrics under that prefix (a sub-env's own figures: vlmgym.envs.base.part_metric)."""
    wanted = {("total", ""): prefix + total_metric}
    if total_metric != AS_TRAINED_METRIC:
        wanted[("as_trained", "")] = prefix + AS_TRAINED_METRIC
    for kind in VALIDATION_KINDS:
        wanted[("validation", kind)] = f"{prefix}val/reward_{kind}"
    for level, (score, weight) in env.reward_levels.items():
        wanted[("levels", level)] = prefix + component_metric(score)
        if weight is not None:
            wanted[("weights", level)] = prefix + component_metric(weight)
    curves = train_curves(curve_file, list(dict.fromkeys(wanted.values())))
    found = {key: curves[metric] for key, metric in wanted.items() if metric in curves}
    total, as_trained = found.get(("total", ""), []), found.get(("as_trained", ""), [])
    if not total:  # a run from before the trainer logged the final-weights reward: the curve it has
        total, as_trained = as_trained, []
    if as_trained == total:  # no curriculum: one curve
        as_trained = []
    return RewardCurves(total=total, as_trained=as_trained,
                        levels={level: c for (kind, level), c in found.items() if kind == "levels"},
                        weights={level: c for (kind, level), c in found.items() if kind == "weights"},
                        validation={name: c for (kind, name), c in found.items() if kind == "validation"})


@dataclass(frozen=True)
class CurvePanel:
    """One panel of a training stage's curves PNG: the figures it draws, by their names in the curve file (those the
    file lacks are left out, and a panel with none of them is not drawn)."""

    title: str
    y_label: str
    metrics: tuple[str, ...]


# The trainers' figures (vlmgym.rl: the SFT and GRPO trainers, vlmgym.rl.validation) under the names the curve file
# holds them by. Only figures of the training itself: the learning rate, gradient and update norms are left out, so a
# rerun whose weights and answers do not change draws the same bytes even when its schedule does.
TRAINING_PANELS = (
    CurvePanel("Loss", "loss", ("loss", "val/loss")),
    CurvePanel("Training reward", "mean reward", ("final_reward_mean", "reward_mean")),
    CurvePanel("Validation reward (val split)", "mean reward", ("val/reward_greedy", "val/reward_sampled")),
    CurvePanel("KL divergence", "KL (nats per token)", ("kl_to_reference", "approx_kl_behaviour",
                                                          "kl_sampler_learner")),
    CurvePanel("Entropy", "nats per token", ("entropy",)),
)
# Where the evaluate stage writes each training stage's curves: a dvc.yaml plot, in a folder the stage outputs to
# DVC's cache, as the report's other images (metrics/plots/ is committed to git, which a PNG per result would bloat).
CURVES_PNG = "reports/curves_{stage}.png"


def curve_panels(curve: Curve) -> list[tuple[CurvePanel, dict[str, list[tuple[int, float]]]]]:
    """The panels of TRAINING_PANELS that `curve` ({step: figures}) has figures for, each with its series
    {metric: (step, value) pairs by step}."""
    panels = []
    for panel in TRAINING_PANELS:
        series = {metric: [(step, figures[metric]) for step, figures in sorted(curve.items()) if metric in figures]
                  for metric in panel.metrics}
        series = {metric: points for metric, points in series.items() if points}
        if series:
            panels.append((panel, series))
    return panels


def centred_mean(values: list[float], half_width: int) -> list[float]:
    """Each value's mean with up to `half_width` values on either side, as many on each (fewer near the ends): a
    trailing mean lags a falling loss by half its window, this draws it where it is."""
    sums = [0.0]
    for value in values:
        sums.append(sums[-1] + value)
    out = []
    for i in range(len(values)):
        k = min(half_width, i, len(values) - 1 - i)
        out.append((sums[i + k + 1] - sums[i - k]) / (2 * k + 1))
    return out


def training_curves_figure(stage: str, curve: Curve):
    """A matplotlib figure of `curve`'s panels (curve_panels), three to a row, titled after the stage; None when the
    curve has none of their figures. The caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = curve_panels(curve)
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.8 * columns, 3.5 * rows), squeeze=False)
    smoothed = False
    for axis, (panel, series) in zip(axes.flat, panels, strict=False):
        for i, (metric, points) in enumerate(series.items()):
            steps, values = [s for s, _ in points], [v for _, v in points]
            colour = POLICY_COLOURS[i % len(POLICY_COLOURS)]
            # e.g. the reward at the final weights and as trained, without a curriculum: dashed, the one under it shows
            style = "--" if points in list(series.values())[:i] else "-"
            window = smoothing_window(len(points))
            # Validation runs every few steps: a few points, each already a mean over the val split, so no smoothing.
            if window == 1 or metric.startswith("val/"):
                axis.plot(steps, values, label=metric, color=colour, marker="o" if len(points) < 50 else None,
                          markersize=3.5, linestyle=style)
            else:  # one step's figure is over a handful of samples: the raw curve stays faint under its mean
                smoothed = True
                axis.plot(steps, values, color=colour, alpha=0.25, linewidth=0.8)
                axis.plot(steps, centred_mean(values, window // 2), label=metric, color=colour, linewidth=1.8,
                          linestyle=style)
        axis.set(xlabel="training step", ylabel=panel.y_label, title=panel.title)
        axis.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
        axis.legend(fontsize="small")
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    figure.suptitle(f"{stage} stage: training curves")
    if smoothed:
        figure.text(0.01, -0.02, "Bold: each step's figure averaged with its neighbours (about a tenth of the run); "
                    "faint: each step.", fontsize="small")
    figure.tight_layout()
    return figure


def write_training_curve_pngs(curve_files: Mapping[str, str | Path], out_root: str | Path = ".") -> dict[str, Path]:
    """Draw each training stage's curve file ({stage: its curve file}) as `<out_root>/CURVES_PNG`; {stage: PNG}
    of those drawn. A stage whose file is absent or holds none of TRAINING_PANELS' figures gets no PNG (e.g.
    `sft.steps: 0`)."""
    written = {}
    for stage, path in curve_files.items():
        path = Path(path)
        figure = training_curves_figure(stage, read_curve(path)) if path.is_file() else None
        if figure is None:
            continue
        try:
            out = Path(out_root) / CURVES_PNG.format(stage=stage)
            save_figure(figure, out)
        finally:
            import matplotlib.pyplot as plt  # loaded by training_curves_figure, on the Agg backend

            plt.close(figure)
        written[stage] = out
    return written
