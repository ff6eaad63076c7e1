"""`train.algorithm: dpo` runs the train stage of the micro pipeline (a copy of it: the shared checkout stays as the
other pipeline tests expect) and logs its figures, validation included, to the copy's MLflow store."""

from __future__ import annotations

import json
import shutil

import yaml
from pipeline_helpers import output_digests, run_checked


def test_online_dpo_runs_the_train_stage(pipeline, tmp_path):
    from mlflow.tracking import MlflowClient

    root = tmp_path / "dpo"
    shutil.copytree(pipeline["root"], root, symlinks=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["algorithm"] = "dpo"
    # More pairs; every update at a nonzero lr; the last step's model (best_val could keep the start's).
    params["train"].update(group_size=4, warmup_steps=0, select="last")
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # The copy's own code and MLflow store (the fixture's environment points at the original checkout's).
    env = {**pipeline["env"], "PYTHONPATH": str(root / "src"), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    before = output_digests(root)
    result = run_checked(["dvc", "repro", "train"], root, env)
    assert "Running stage 'train'" in result.stdout
    after = output_digests(root)
    changed = {path for path in after if after[path] != before.get(path)}
    assert not any(path.startswith("models/jax/sft/") for path in changed)
    assert "reward_mean" in json.loads((root / "metrics/train.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vlmgym")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`vlmgym.stage` = 'train'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    run = runs[0]
    assert run.data.params["algorithm"] == "dpo" and run.info.status == "FINISHED"
    assert {"dpo_margin", "dpo_pairs", "final_reward_mean", "val/reward_greedy", "val/reward_sampled"} <= set(
        run.data.metrics)
    validated = client.get_metric_history(run.info.run_id, "val/reward_greedy")
    assert sorted(m.step for m in validated) == [0, 1, 2]  # the start policy, then every step (micro: val_every 1)
    # Small groups of an untrained policy often tie (no pair, no gradient): the model moves iff some pair existed.
    pairs = sum(m.value for m in client.get_metric_history(run.info.run_id, "dpo_pairs"))
    assert any(path.startswith("models/jax/grpo/") for path in changed) == (pairs > 0), (pairs, changed)
