"""`train.algorithm: dpo | ppo` runs the train stage of the micro pipeline (in a copy of it: the shared checkout
stays as it is) and logs its figures, validation included, to the copy's MLflow store."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
import yaml
from pipeline_helpers import run_checked

from vlmgym.models.checkpoint import load_checkpoint

# What each algorithm logs beside the rewards, and the figure that says whether it had a learning signal.
ALGORITHMS = {"dpo": ({"dpo_margin", "dpo_pairs"}, "dpo_pairs"),
              "ppo": ({"value_loss", "value_mean", "return_mean"}, "reward_mean")}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_algorithm_runs_the_train_stage(pipeline, tmp_path, algorithm):
    from mlflow.tracking import MlflowClient

    root = tmp_path / algorithm
    shutil.copytree(pipeline["root"], root, symlinks=True)
    # The micro preset as committed: other tests leave their own changes (e.g. a weight decay) in params.yaml.
    run_checked(["git", "checkout", "--", "params.yaml"], root, pipeline["env"])
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["algorithm"] = algorithm
    params["train"]["group_size"] = 4  # more pairs
    params["train"]["optimizer"]["warmup_steps"] = 0  # every update at a nonzero lr
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # The copy's own code and MLflow store (the fixture's environment points at the original checkout's).
    env = {**pipeline["env"], "PYTHONPATH": str(root / "src"), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    result = run_checked(["dvc", "repro", "train"], root, env)
    assert "Running stage 'train'" in result.stdout
    assert "reward_mean" in json.loads((root / "metrics/train.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vlmgym")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`vlmgym.stage` = 'train'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    run = runs[0]
    # `dpo` is read as its canonical name, online_dpo (the name MLflow records)
    assert run.data.params["algorithm"] == {"dpo": "online_dpo"}.get(algorithm, algorithm)
    assert run.info.status == "FINISHED"
    figures, signal = ALGORITHMS[algorithm]
    assert figures | {"final_reward_mean", "val/reward_greedy", "val/reward_sampled"} <= set(run.data.metrics)
    validated = client.get_metric_history(run.info.run_id, "val/reward_greedy")
    assert sorted(m.step for m in validated) == [0, 1, 2]  # the start, then every step (micro: validation.every 1)
    # The trained model differs from its start (the sft model) iff a step had a learning signal: a preference
    # pair (DPO), a nonzero reward (PPO: with all rewards 0, returns, values and advantages are all 0). The micro
    # preset's untrained policy often has neither, so either outcome can occur; each is checked.
    # Values, not bytes: an update of exactly 0 still turns a -0.0 weight into 0.0.
    trained, start = (jax.tree.leaves(load_checkpoint(root / "models/jax" / name)[1]) for name in ("grpo", "sft"))
    changed = not all(np.array_equal(a, b) for a, b in zip(trained, start, strict=True))
    signal_seen = any(m.value > 0 for m in client.get_metric_history(run.info.run_id, signal))
    assert changed == signal_seen, (signal_seen, changed)


def test_train_stage_over_two_processes(pipeline, tmp_path):
    """docs/scaling.md "Scale out", on one machine: process 0 runs the train stage under DVC, process 1 the stage's
    script with the same settings; together they train, validate, checkpoint and save; process 0 alone tracks."""
    import socket
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    from vlmgym.runtime import distributed

    root = tmp_path / "two"
    shutil.copytree(pipeline["root"], root, symlinks=True)
    run_checked(["git", "checkout", "--", "params.yaml"], root, pipeline["env"])
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["validation"]["select"] = "best_val"  # the best params are saved by both processes together
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    uri = f"sqlite:///{root / 'mlflow.db'}"
    env = {**pipeline["env"], "PYTHONPATH": str(root / "src"), "MLFLOW_TRACKING_URI": uri}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    commands = (["dvc", "repro", "-s", "train"], [sys.executable, "stages/train.py"])
    processes = []
    for index, command in enumerate(commands):
        settings = {distributed.COORDINATOR_ENV: f"127.0.0.1:{port}", distributed.NUM_PROCESSES_ENV: "2",
                    distributed.PROCESS_ID_ENV: str(index), distributed.HEARTBEAT_ENV: "10"}
        with open(tmp_path / f"process-{index}.log", "w") as log:
            processes.append(subprocess.Popen(command, cwd=root, env={**env, **settings}, stdout=log,
                                              stderr=subprocess.STDOUT))
    for index, process in enumerate(processes):
        code = process.wait(timeout=1800)
        assert code == 0, (tmp_path / f"process-{index}.log").read_text()[-5000:]
    logs = [(tmp_path / f"process-{i}.log").read_text() for i in range(2)]
    assert "Running stage 'train'" in logs[0] and "process 1 of 2 joined" in logs[1]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("vlmgym")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`vlmgym.stage` = 'train'",
                              order_by=["attributes.start_time DESC"])
    run = runs[0]
    assert run.data.params["processes"] == "2" and run.info.status == "FINISHED"
    assert sum(r.data.params.get("processes") == "2" for r in runs) == 1  # process 1 logged nothing
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/reward_greedy")) == [0, 1, 2]
    summary = json.loads((root / "metrics/train.json").read_text())
    assert summary["selected_step"] in (0, 1, 2) and "reward_mean" in summary
    trained, start = (load_checkpoint(root / "models/jax" / name)[1] for name in ("grpo", "sft"))
    assert jax.tree.structure(trained) == jax.tree.structure(start)
    assert not list(root.glob("models/jax/.*multiprocess*"))  # the shared temp folder was renamed into place
    status = run_checked(["dvc", "status", "train"], root, env).stdout
    assert "changed outs" not in status  # DVC recorded what the two processes wrote
