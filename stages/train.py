"""train stage: GRPO (or RLOO, PPO, DPO: train.algorithm) from the sft model on the train split -> models/jax/grpo/.

Each step samples `train.group_size` answers for `train.batch_prompts` prompts with the rollout engine, scores
them with the env (its curriculum follows step / total steps), and takes `train.num_iterations` clipped-surrogate
updates. Every step's figures go to MLflow (reward and its components, clip fractions, KL, entropy, lengths,
sampler-vs-learner mismatch, gradient norm, lr, throughput, compiles), and all but the timings and compile counts
to metrics/curves/train.jsonl (vlmgym.tracking.step_curve), which the evaluate stage draws its training curves from;
every `train.samples_every` steps a table of sample rollouts (image, answer, reward components) is logged as an
artifact. Checkpoints in `train.checkpointing.dir/<inputs hash>/` make a killed run resume exactly.

Over several processes (hosts), each runs this script with the same params and code (docs/scaling.md, "Scale out"):
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID or the flags below; process 0 logs to MLflow and
writes metrics/train.json and metrics/curves/train.jsonl, all of them write the checkpoints and the model folder
together.

    python stages/train.py [--params params.yaml] [--coordinator HOST:PORT --num-processes N --process-id I]
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from vlmgym.params import load_section
from vlmgym.rl.loop import RECENT_METRICS
from vlmgym.rl.stage_setup import (
    history_summary,
    resume_dir,
    save_model,
    selection_summary,
    stage_policy,
    stage_trainer,
    write_json_atomically,
)
from vlmgym.runtime import distributed
from vlmgym.runtime.collector import collect_less
from vlmgym.tracking import stage_runs as tracking
from vlmgym.tracking import step_curve

METRICS_FILE = "metrics/train.json"
CURVE_FILE = step_curve.curve_file("train")
# Figures of the final steps summarised into the DVC metrics file (mean over the last SUMMARY_STEPS steps, which
# checkpoints keep, so a run restarted after its last step reports the same summary).
SUMMARY = ("reward_mean", "reward_std", "zero_std_group_share", "completion_length", "approx_kl_behaviour", "entropy")
SUMMARY_STEPS = RECENT_METRICS


def main(argv: list[str] | None = None) -> int:
    """Train with GRPO, save the model folder and log one MLflow run."""
    collect_less()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (sections train, model, env)")
    parser.add_argument("--coordinator", help=f"process 0's host:port in a multi-process run "
                                              f"(default: ${distributed.COORDINATOR_ENV})")
    parser.add_argument("--num-processes", type=int, help=f"processes of the run (default: "
                                                          f"${distributed.NUM_PROCESSES_ENV}; 1: this one alone)")
    parser.add_argument("--process-id", type=int, help=f"this process's index (default: ${distributed.PROCESS_ID_ENV})")
    args = parser.parse_args(argv)
    distributed.initialize(distributed.settings_from(args.coordinator, args.num_processes, args.process_id))
    with distributed.exit_together("train"):
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    train = load_section("train", args.params)
    model = load_section("model", args.params)
    env_params = load_section("env", args.params)
    logged = {"model.dtype": model.dtype, "model.param_dtype": model.param_dtype, "env.name": env_params.name}
    checkpoints = resume_dir(train.checkpointing.dir, train, model, env_params, init_dir=train.init_dir)
    if distributed.count() > 1:
        logged["processes"] = distributed.count()
    # Over several processes only process 0 tracks (the others compute the same figures).
    tracked = (tracking.stage_run("train", train, extra_params=logged, params_file=args.params,
                                  resume_folder=checkpoints) if distributed.is_primary()
               else contextlib.nullcontext())
    with tracked as run:
        journal = None if run is None else step_curve.StepJournal(checkpoints)
        callbacks = {} if run is None else {
            "metrics_callback": journal.callback(lambda step, metrics: run.log_metrics(metrics, step=step)),
            "samples_callback": run.log_sample_table}
        policy, params = stage_policy("train", train, model)
        trainer = stage_trainer("train", train, policy, params, env_params, checkpoints, **callbacks)
        params = trainer.run()
        out = save_model(train.out_dir, policy, params, train.init_dir, train.lora.dropout)
        summary = history_summary(trainer.restored_history + trainer.history, SUMMARY, SUMMARY_STEPS)
        summary.update(selection_summary(trainer))
        if run is not None:
            write_json_atomically(METRICS_FILE, summary)
            step_curve.write_curve(CURVE_FILE, journal.entries())
            run.log_dict({**summary, "resumed_from": trainer.resumed_from, "checkpoints": str(checkpoints)},
                         "train.json")
    print(f"train: {train.init_dir} -> {out} ({train.steps} steps; last {SUMMARY_STEPS} steps: "
          + ", ".join(f"{k} {v:.4f}" for k, v in summary.items()) + ")")
    return 0


if __name__ == "__main__":
    from vlmgym.runtime.errors import guarded

    sys.exit(guarded("train", main))
