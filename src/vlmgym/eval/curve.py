"""The training curves of the model being evaluated, read from the train stage's curve file.

The train stage writes every step's figures, under the names MLflow gets them, to `metrics/curves/train.jsonl`
(vlmgym.tracking.step_curve), a DVC output of the stage that writes the model folder and a dep of the evaluate
stage: the curves always belong to the evaluated weights, and a clone that `dvc pull`s draws the same report from
the same dvc.lock (no MLflow store needed). A run resumed from a checkpoint writes the same file as an
uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vlmgym.stats.plots import RewardCurves
from vlmgym.tracking.step_curve import read_curve

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
