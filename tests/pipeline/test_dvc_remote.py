"""Cached stages travel to a second machine through a DVC remote (docs/dvc-remote.md).

The machine that ran the micro pipeline adds a local-folder remote as the default, commits, and `dvc push`es; a
fresh `git clone` (no cache, no outputs, no checkpoints/) `dvc pull`s, and `dvc repro` there runs no stage and
leaves every output byte-equal. A local folder stands for S3, GCS or SSH: DVC moves the same objects to each.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pipeline_helpers import STAGES, output_digests, run_checked, stages_run


def _env_for(checkout: Path, base: dict[str, str], mlflow_db: Path) -> dict[str, str]:
    # The stages import vlmgym from PYTHONPATH and log to MLFLOW_TRACKING_URI: point both at this checkout, so a
    # stage that (wrongly) reruns here neither runs the other checkout's code nor adds runs to its store.
    return {**base, "PYTHONPATH": str(checkout / "src"), "MLFLOW_TRACKING_URI": f"sqlite:///{mlflow_db}"}


def test_outputs_pushed_to_a_local_remote_are_pulled_into_a_fresh_clone_that_reruns_nothing(pipeline, tmp_path):
    # A copy of the pipeline checkout, which is shared with other tests that change its params and git state. The
    # copy has what the machine that ran the pipeline has: outputs, DVC cache, checkpoints, MLflow store.
    first = tmp_path / "first"
    shutil.copytree(pipeline["root"], first, symlinks=True)
    env = _env_for(first, pipeline["env"], first / "mlflow.db")
    # Brings dvc.lock up to date should an earlier test have left params changed (evaluate then finds the train
    # run in the copied MLflow store); a no-op otherwise.
    run_checked(["dvc", "repro"], first, env)
    expected = output_digests(first)

    remote = tmp_path / "remote"
    remote.mkdir()
    run_checked(["dvc", "remote", "add", "-d", "shared", str(remote)], first, env)
    run_checked(["git", "add", "-A"], first, env)
    run_checked(["git", "commit", "-qm", "pipeline outputs and the DVC remote"], first, env)
    run_checked(["dvc", "push"], first, env)
    assert any(p.is_file() for p in remote.rglob("*")), "dvc push sent nothing to the remote"

    second = tmp_path / "second"
    run_checked(["git", "clone", "-q", str(first), str(second)], tmp_path, env)
    env2 = _env_for(second, pipeline["env"], tmp_path / "second-mlflow.db")
    for absent in ("data", "models", "outputs", "reports", "checkpoints", ".dvc/cache"):
        assert not (second / absent).exists(), f"{absent} came through git"
    # Without the pull every stage is out of date here (its outputs are missing): the no-op below is the pull's.
    # (the pipeline's own: the checkout also holds the studies' dvc.yaml files, which have not run)
    assert set(json.loads(run_checked(["dvc", "status", "--json", "dvc.yaml"], second, env2).stdout)) == set(STAGES)

    run_checked(["dvc", "pull", "dvc.yaml"], second, env2)  # as docs/dvc-remote.md: the studies' have none yet
    status = run_checked(["dvc", "status", "dvc.yaml"], second, env2).stdout
    assert "up to date" in status, status
    again = run_checked(["dvc", "repro"], second, env2)
    assert stages_run(again.stdout) == [], again.stdout[-3000:]
    assert output_digests(second) == expected
    # Neither resumable training checkpoints (no DVC out) nor DVC's run history (`dvc push --run-cache`, not used
    # here) is needed to skip every stage: the committed dvc.lock and the pulled outputs are.
    assert not (second / "checkpoints").exists()
    assert not (second / ".dvc" / "cache" / "runs").exists()
    assert run_checked(["git", "status", "--porcelain"], second, env2).stdout == ""
    assert not (tmp_path / "second-mlflow.db").exists(), "a stage ran (and logged to MLflow) in the clone"
