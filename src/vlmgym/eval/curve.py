"""The training reward curves of the model being evaluated, found in MLflow through the train run's lineage tags.

The train stage logs its per-step metrics to one MLflow run and, once it succeeds, tags the run with the DVC hash
of each output (`dvc.out.<path>`, see vlmgym.tracking.stage_runs). The run that produced the model folder on disk
is the one whose tag equals that folder's hash now, so the curves always belong to the evaluated weights, even when
`dvc repro` skipped train this time. A run resumed from a checkpoint holds the steps after its resume point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlmgym.stats.plots import RewardCurves
from vlmgym.tracking.stage_runs import dvc_hash


def train_run_id(model_dir: str, *, tracking_uri: str, experiment: str, stage: str = "train") -> str | None:
    """The newest finished MLflow run of `stage` that wrote `model_dir` as it is now and logged training metrics
    (None when there is none). A run that trained nothing is passed over: `dvc repro -f` with the checkpoints in
    place restores the last one and saves the same weights in a new run without a single step."""
    from mlflow.tracking import MlflowClient

    digest = dvc_hash(model_dir)
    if digest is None:
        return None
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    # The tag name is the path exactly as dvc.yaml spells it (relative, forward slashes).
    tag = f"dvc.out.{Path(model_dir).as_posix()}"
    runs = client.search_runs([found.experiment_id],
                              filter_string=f"tags.`vlmgym.stage` = '{stage}' and tags.`{tag}` = '{digest}'",
                              order_by=["attributes.start_time DESC"], max_results=50)
    return next((run.info.run_id for run in runs if run.data.metrics), None)


# The GRPO trainer's mean reward at each step's curriculum weights (what it optimised then); its
# `final_reward_mean` scores the same samples at the final weights (vlmgym.rl.grpo_trainer.GRPOTrainer._metrics).
AS_TRAINED_METRIC = "reward_mean"
# The trainer's validation figures (vlmgym.rl.validation): val/reward_greedy, val/reward_sampled.
VALIDATION_KINDS = ("greedy", "sampled")


def component_metric(component: str) -> str:
    """The MLflow metric the GRPO trainer logs a reward component under: each step's mean over its samples
    (vlmgym.rl.grpo_trainer.GRPOTrainer._metrics)."""
    return f"reward/{component}"


def train_curves(model_dir: str, metrics: list[str], *, tracking_uri: str,
                 experiment: str) -> tuple[dict[str, list[tuple[int, float]]], str | None]:
    """({metric: (step, value) pairs}, run id) of the train run that wrote `model_dir`; ({}, None) if none.

    A metric the run never logged is left out (an older run, or an env whose reward has no such component)."""
    from mlflow.tracking import MlflowClient

    run_id = train_run_id(model_dir, tracking_uri=tracking_uri, experiment=experiment)
    if run_id is None:
        return {}, None
    client = MlflowClient(tracking_uri=tracking_uri)
    curves = {}
    for metric in metrics:
        by_step = {int(m.step): float(m.value) for m in client.get_metric_history(run_id, metric)}  # a re-log: last
        if by_step:
            curves[metric] = sorted(by_step.items())
    return curves, run_id


def train_reward_curve(model_dir: str, metric: str, *, tracking_uri: str,
                       experiment: str) -> tuple[list[tuple[int, float]], str | None]:
    """((step, value) pairs of `metric`, run id) of the train run that wrote `model_dir`; ([], None) if none."""
    curves, run_id = train_curves(model_dir, [metric], tracking_uri=tracking_uri, experiment=experiment)
    return curves.get(metric, []), run_id


def reward_curves(env: Any, model_dir: str, total_metric: str, *, tracking_uri: str,
                  experiment: str, prefix: str = "") -> tuple[RewardCurves, str | None]:
    """The training reward (`total_metric`), the reward as trained when that is another metric, the validation
    curves when the run validated, and, for an env with reward levels (Env.reward_levels), each level's
    unweighted score and weight per step, from the train run that wrote `model_dir`; (empty, None) if none.
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
    curves, run_id = train_curves(model_dir, list(dict.fromkeys(wanted.values())), tracking_uri=tracking_uri,
                                  experiment=experiment)
    found = {key: curves[metric] for key, metric in wanted.items() if metric in curves}
    total, as_trained = found.get(("total", ""), []), found.get(("as_trained", ""), [])
    if not total:  # a run from before the trainer logged the final-weights reward: the curve it has
        total, as_trained = as_trained, []
    if as_trained == total:  # no curriculum: one curve
        as_trained = []
    return RewardCurves(total=total, as_trained=as_trained,
                        levels={level: c for (kind, level), c in found.items() if kind == "levels"},
                        weights={level: c for (kind, level), c in found.items() if kind == "weights"},
                        validation={name: c for (kind, name), c in found.items() if kind == "validation"}), run_id
