"""Every stage killed (SIGKILL) inside its write, then `dvc repro` again: the killed write's temp is gone at once
(its janitor), the outputs equal an uninterrupted run's, and no temp is left under the output folders.

One fresh micro checkout, ten `dvc repro`s: run k kills stage k inside its write (VLMGYM_KILL_IN_WRITE, see
vlmgym.runtime.killpoint), run k+1 reruns stage k (a killed stage has no DVC run-cache entry) and kills stage k+1. The
training stages are killed while orbax writes a checkpoint after their first one, so their rerun resumes, and
continues the same MLflow run (each other killed stage's run is closed as KILLED). The reference is the
`pipeline` fixture's uninterrupted run of a checkout of the same files; this run compiles every program itself
(its own JAX compilation cache), so it is also that run again from scratch: every output byte and dvc.lock equal.
"""

from __future__ import annotations

import signal
import subprocess
import time

from pipeline_helpers import STAGES, micro_checkout, output_digests, run_checked, stages_run

from vlmgym.rl.checkpoint import ORBAX_TEMP_GLOB
from vlmgym.runtime import killpoint, temps
from vlmgym.tracking import pipeline_run

# Where each stage is killed (a part of its target path, or a pattern for a checkpoint save's `<folder>/<step>`;
# micro preset: sft saves steps 2 and 4, train steps 1 and 2) and what its janitor then removes.
KILL_AT = {
    "download": ("data/raw", "data/.raw."),
    "shard": ("data/shards", "data/.shards."),
    "base_model": ("models/hf/base", "models/hf/.base."),
    "convert": ("models/jax/base", "models/jax/.base."),
    "sft": ("*/checkpoints/sft/*/4", "/4.orbax-checkpoint-tmp"),
    "train": ("*/checkpoints/train/*/2", "/2.orbax-checkpoint-tmp"),
    "rollout": ("outputs/rollouts", "outputs/.rollouts."),
    "export": ("models/hf/grpo", "models/hf/.grpo."),
    "evaluate": ("metrics/eval.json", "metrics/.eval.json."),
}
def _leftovers(root):
    found = [t.path for t in temps.temps_under(root / name for name in temps.OUTPUT_ROOTS)]
    return found + list((root / "checkpoints").rglob(ORBAX_TEMP_GLOB))


def test_each_stage_killed_inside_its_write_reruns_to_the_same_outputs_without_leftovers(request, tmp_path):
    root = tmp_path / "checkout"
    root.mkdir()
    # Its own compilation cache: no program compiled by the reference run (killed and rerun stages share theirs).
    env = {**micro_checkout(root), "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax-compilation-cache")}
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "micro preset"], root, env)
    for index, stage in enumerate(STAGES):
        label, removed = KILL_AT[stage]
        result = subprocess.run(["dvc", "repro"], cwd=root, env={**env, killpoint.ENV: label},
                                capture_output=True, text=True, timeout=900)
        output = result.stdout + result.stderr
        assert result.returncode != 0, f"{stage} was not killed:\n{output[-3000:]}"
        # DVC reports the signal itself (-9) when it ran the stage directly, or 128+9 when a shell that did not exec
        # the command sat in between (CI's /bin/sh does that; this machine's does not)
        killed = {f"exited with {-signal.SIGKILL}", f"exited with {128 + signal.SIGKILL}"}
        assert f"{killpoint.ENV}: killing pid" in output and any(code in output for code in killed), output[-3000:]
        assert stages_run(result.stdout) == STAGES[max(0, index - 1):index + 1], output[-3000:]
        janitor = [line for line in output.splitlines() if "its writer died before finishing it" in line]
        assert any(removed in line and str(root) in line for line in janitor), (stage, janitor, output[-3000:])
        for _ in range(100):  # the janitor holds the output pipes until it is done; this is only a margin
            if not _leftovers(root):
                break
            time.sleep(0.1)
        assert _leftovers(root) == [], stage

    final = run_checked(["dvc", "repro"], root, env)
    assert stages_run(final.stdout) == ["evaluate"]
    assert _leftovers(root) == []
    _check_mlflow_runs(root)

    # Every byte of every output equals the uninterrupted run's (metrics/curves/ included: a resumed training
    # journals the steps it recomputes again, and the last entry of each step wins). The reference is asked for
    # only now: another worker builds it while this test kills and reruns its own checkout.
    reference = request.getfixturevalue("pipeline")
    expected, got = reference["digests"], output_digests(root)
    assert sorted(got) == sorted(expected), "the rerun's outputs are not the same files"
    assert sorted(path for path in got if got[path] != expected[path]) == []
    # The same dvc.lock too: every stage's deps, params and outs hash alike (a committed dvc.lock stays as it is).
    assert (root / "dvc.lock").read_text() == (reference["root"] / "dvc.lock").read_text()


def _check_mlflow_runs(root):
    """Each killed stage's run closed as KILLED; sft and train each one continued run with every step once."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("vlmgym")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    # One parent per `dvc repro`: the nine killed ones closed as KILLED (their dvc process is gone), the last one
    # finished; each stage run is nested in the pipeline that ran it (a continued training run in the one that
    # finished it).
    parents = [r for r in runs if r.data.tags.get(pipeline_run.ROLE_TAG) == pipeline_run.PIPELINE_ROLE]
    assert [p.info.status for p in parents] == ["KILLED"] * len(STAGES) + ["FINISHED"]
    runs = [r for r in runs if r not in parents]
    assert {r.data.tags[pipeline_run.PARENT_TAG] for r in runs} <= {p.info.run_id for p in parents}
    for run in runs:
        assert run.data.tags[pipeline_run.PARENT_TAG] == next(
            p.info.run_id for p in parents if p.data.tags["vlmgym.pipeline_id"] == run.data.tags["vlmgym.pipeline_id"])
    by_stage = {}
    for run in runs:
        by_stage.setdefault(run.data.tags["vlmgym.stage"], []).append(run.info.status)
    for stage in STAGES:
        expected = ["FINISHED"] if stage in ("sft", "train") else ["KILLED", "FINISHED"]
        assert by_stage[stage] == expected, (stage, by_stage)
    for run in runs:
        if run.data.tags["vlmgym.stage"] in ("sft", "train"):
            assert run.data.tags["vlmgym.resumed_times"] == "1"
            for key in run.data.metrics:
                steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
                assert len(steps) == len(set(steps)), (run.data.tags["vlmgym.stage"], key, steps)
