"""A training stage's curve file (vlmgym.tracking.step_curve): each step once, by step, and the same bytes for a run
killed and resumed from a checkpoint as for an uninterrupted one."""

from __future__ import annotations

import json
import time

import pytest

from vlmgym.rl.loop import TIMING_METRICS
from vlmgym.tracking import step_curve
from vlmgym.tracking.step_curve import JOURNAL, StepJournal, read_curve, read_journal, write_curve


def figures(step: int) -> dict:
    """What a trainer hands its metrics callback at `step`: figures of the training, timings that differ on every
    run, a non-number and a non-finite figure."""
    return {"reward_mean": step / 3, "loss": 1.0 / (step + 1), "reward/k_city": 0.125 * step, "pass@4": 0.5,
            "step_time_s": time.perf_counter(), "compile_count": float(step),
            "rollout_compile_count": 3.0, "note": "text", "kl": float("nan")}


def train(folder, steps: range, logged: list | None = None) -> StepJournal:
    """A run of `steps` through the journal's callback (as the stages wire it: journal, then MLflow)."""
    journal = StepJournal(folder)
    callback = journal.callback(None if logged is None else lambda step, metrics: logged.append(step))
    for step in steps:
        callback(step, figures(step))
    return journal


def test_the_process_metrics_cover_the_loops_timings():
    assert TIMING_METRICS <= step_curve.PROCESS_METRICS


def test_a_step_keeps_the_figures_mlflow_gets_less_the_timings(tmp_path):
    logged = []
    journal = train(tmp_path / "ckpt", range(1, 3), logged)
    assert logged == [1, 2]  # the wrapped callback still runs
    out = write_curve(tmp_path / "metrics/curves/train.jsonl", journal.entries())
    lines = out.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    first = json.loads(lines[0])
    assert list(first) == ["step", "metrics"]
    # MLflow's names (vlmgym.tracking.stage_runs.finite_metrics), sorted; finite numbers only; no timings
    assert first["metrics"] == {"loss": 0.5, "pass_at_4": 0.5, "reward/k_city": 0.125, "reward_mean": 1 / 3}
    assert read_curve(out) == {1: first["metrics"], 2: json.loads(lines[1])["metrics"]}


def test_a_resumed_run_writes_the_bytes_of_an_uninterrupted_one(tmp_path):
    whole = write_curve(tmp_path / "whole.jsonl", train(tmp_path / "whole", range(0, 6)).entries()).read_bytes()
    # Killed after step 4's figures were journaled and while step 5's were written (a torn last line); the
    # checkpoint it resumes from is step 2's, so steps 3 and 4 run again.
    folder = tmp_path / "killed"
    train(folder, range(0, 5))
    with open(folder / JOURNAL, "a") as handle:
        handle.write('{"step": 5, "metrics": {"loss": 0.1')
    assert sorted(read_journal(folder / JOURNAL)) == [0, 1, 2, 3, 4]  # the torn line is left out
    resumed = train(folder, range(3, 6))
    journaled = [json.loads(line)["step"] for line in (folder / JOURNAL).read_text().splitlines()]
    assert journaled == [0, 1, 2, 3, 4, 3, 4, 5]  # the torn line was cut before the resumed run appended
    assert write_curve(tmp_path / "resumed.jsonl", resumed.entries()).read_bytes() == whole
    # Killed again before any step: the journal as it was, and the same file once more.
    assert write_curve(tmp_path / "again.jsonl", StepJournal(folder).entries()).read_bytes() == whole


def test_each_step_once_the_last_entry_winning(tmp_path):
    journal = tmp_path / JOURNAL
    journal.write_text('{"step": 2, "metrics": {"loss": 0.5}}\n{"step": 1, "metrics": {"loss": 0.9}}\n'
                       '{"step": 2, "metrics": {"loss": 0.25}}\n{"step": 3, "metr')
    assert read_journal(journal) == {1: {"loss": 0.9}, 2: {"loss": 0.25}}
    out = write_curve(tmp_path / "curve.jsonl", read_journal(journal))
    assert out.read_text() == ('{"step": 1, "metrics": {"loss": 0.9}}\n'
                               '{"step": 2, "metrics": {"loss": 0.25}}\n')


def test_no_steps_is_an_empty_file_and_no_journal_no_steps(tmp_path):
    assert read_journal(tmp_path / "absent" / JOURNAL) == {}
    out = write_curve(tmp_path / "metrics/curves/sft.jsonl", {})
    assert out.read_bytes() == b"" and read_curve(out) == {}


def test_a_damaged_line_is_an_error_naming_it(tmp_path):
    journal = tmp_path / JOURNAL
    journal.write_text('{"step": 1, "metrics": {"loss": 0.5}}\nnot json\n{"step": 2, "metrics": {}}\n')
    with pytest.raises(ValueError, match=f"{JOURNAL}:2: not a curve entry"):
        read_journal(journal)
    curve = tmp_path / "curve.jsonl"
    curve.write_text('{"step": 1, "metrics": {}}\n{"step": 1, "metrics": {}}\n')
    with pytest.raises(ValueError, match="curve.jsonl:2: step 1 again"):
        read_curve(curve)
    curve.write_text('{"step": "1", "metrics": {}}\n')
    with pytest.raises(ValueError, match="not a curve entry"):
        read_curve(curve)


def test_the_stages_write_the_paths_dvc_yaml_names():
    from pathlib import Path

    import yaml

    stages = yaml.safe_load((Path(__file__).resolve().parents[2] / "dvc.yaml").read_text())["stages"]
    for stage in ("sft", "train"):
        assert step_curve.curve_file(stage) in stages[stage]["outs"], stage
    assert step_curve.curve_file("train") in stages["evaluate"]["deps"]


def test_replay_hands_the_restored_steps_on_in_order_without_journaling_them_again(tmp_path):
    folder = tmp_path / "ckpt"
    train(folder, range(0, 5))
    lines = (folder / JOURNAL).read_text()
    handed = []
    callback = StepJournal(folder).callback(lambda step, metrics: handed.append((step, dict(metrics))))
    assert callback.replay_through(3) == 4
    assert [step for step, _ in handed] == [0, 1, 2, 3]  # the steps after the checkpoint are trained again
    assert handed[2][1] == read_journal(folder / JOURNAL)[2]
    assert (folder / JOURNAL).read_text() == lines
    assert StepJournal(folder).callback(None).replay_through(3) == 0


def test_a_forced_rerun_over_a_finished_checkpoint_logs_every_step_to_its_new_run(tmp_path, monkeypatch):
    """`dvc repro -f` over a finished checkpoint resumes at the last step and trains none: its new MLflow run still
    gets every step's figures, from the journal."""
    import sys
    from pathlib import Path

    import jax
    from mlflow.tracking import MlflowClient

    sys.path.insert(0, str(Path(__file__).parents[1] / "rl"))
    from toy import ToyEnv, ToyPolicy

    from vlmgym.params import SFTParams, with_values
    from vlmgym.rl.sft_trainer import SFTTrainer
    from vlmgym.tracking.stage_runs import stage_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    config = with_values(SFTParams(steps=4, batch_size=4), {"validation.every": 0, "optimizer.lr": 0.03,
                                                           "checkpointing.every": 2})
    folder = tmp_path / "checkpoints" / "sft"

    def stage():
        with stage_run("sft", {"a": 1}, experiment="rerun", resume_folder=folder) as run:
            journal = StepJournal(folder)
            trainer = SFTTrainer(ToyPolicy(), ToyEnv(), ToyPolicy().init(jax.random.key(0)), config, folder,
                                 progress_bar=False, metrics_callback=journal.callback(
                                     lambda step, metrics: run.log_metrics(metrics, step=step)))
            trainer.run()
        return trainer, run.run_id

    first, first_id = stage()
    rerun, rerun_id = stage()
    assert rerun.resumed_from == 4 and rerun.history == [] and rerun_id != first_id
    client = MlflowClient(uri)
    for key in ("loss", "grad_norm", "target_length"):
        trained = [(m.step, m.value) for m in client.get_metric_history(first_id, key)]
        assert [step for step, _ in trained] == [1, 2, 3, 4]
        assert [(m.step, m.value) for m in client.get_metric_history(rerun_id, key)] == trained, key
