"""The training reward curve of the model being evaluated, found in MLflow through the train run's lineage tags.

The train stage logs its per-step metrics to one MLflow run and, once it succeeds, tags the run with the DVC hash
of each output (`dvc.out.<path>`, see vlmgym.tracking). The run that produced the model folder on disk is the one
whose tag equals that folder's hash now, so the curve always belongs to the evaluated weights, even when
`dvc repro` skipped train this time. A run resumed from a checkpoint holds the steps after its resume point.
"""

from __future__ import annotations

from pathlib import Path

from vlmgym.tracking import dvc_hash


def train_run_id(model_dir: str, *, tracking_uri: str, experiment: str, stage: str = "train") -> str | None:
    """The newest finished MLflow run of `stage` that wrote `model_dir` as it is now (None when there is none)."""
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
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def train_reward_curve(model_dir: str, metric: str, *, tracking_uri: str,
                       experiment: str) -> tuple[list[tuple[int, float]], str | None]:
    """((step, value) pairs of `metric`, run id) of the train run that wrote `model_dir`; ([], None) if none."""
    from mlflow.tracking import MlflowClient

    run_id = train_run_id(model_dir, tracking_uri=tracking_uri, experiment=experiment)
    if run_id is None:
        return [], None
    history = MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, metric)
    by_step = {int(m.step): float(m.value) for m in history}  # one value per step (a re-log keeps the last)
    return sorted(by_step.items()), run_id
