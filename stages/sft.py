"""sft stage: supervised warm start of the base model on the env's ideal answers -> models/jax/sft/.

Teacher-forced cross entropy on the answer tokens only (prompt and padding masked), AdamW with warmup and
cosine decay. Checkpoints go to `sft.checkpointing.dir/<inputs hash>/` (params, start model, shards, code) every
`sft.checkpointing.every` steps, so a killed run started again with the same inputs resumes exactly where the last
checkpoint left it. Every step's figures go
to MLflow and, less the timings and compile counts, to metrics/curves/sft.jsonl (vlmgym.tracking.step_curve).
With `sft.perception.steps` > 0 the vision tower is first warmed up on the env's image labels
(vlmgym.rl.perception), once per checkpoint folder. `sft.steps: 0` copies the start model through unchanged (the
real Instruct model needs no warm start) and writes an empty curve.

    python stages/sft.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import sys

from vlmgym.params import load_section
from vlmgym.rl.stage_setup import (
    check_sft_budget,
    resume_dir,
    save_model,
    selection_summary,
    stage_policy,
    stage_trainer,
    warm_perception,
    write_json_atomically,
)
from vlmgym.runtime.collector import collect_less
from vlmgym.tracking import stage_runs as tracking
from vlmgym.tracking import step_curve

METRICS_FILE = "metrics/sft.json"
CURVE_FILE = step_curve.curve_file("sft")


def main(argv: list[str] | None = None) -> int:
    """Fine-tune (or pass through), save the model folder and log one MLflow run."""
    collect_less()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (sections sft, model, env)")
    args = parser.parse_args(argv)
    sft = load_section("sft", args.params)
    model = load_section("model", args.params)
    env_params = load_section("env", args.params)
    logged = {"model.dtype": model.dtype, "model.param_dtype": model.param_dtype, "env.name": env_params.name}
    checkpoints = (resume_dir(sft.checkpointing.dir, sft, model, env_params, init_dir=sft.init_dir)
                   if sft.steps > 0 else None)
    with tracking.stage_run("sft", sft, extra_params=logged, params_file=args.params,
                            resume_folder=checkpoints) as run:
        policy, params = stage_policy("sft", sft, model)
        summary = {"steps": sft.steps}
        curve: step_curve.Curve = {}
        if checkpoints is not None:
            check_sft_budget(sft, policy, env_params)
            if sft.perception.steps:
                params, warmed = warm_perception(sft, policy, params, env_params, checkpoints,
                                                 log=lambda step, metrics: run.log_metrics(metrics, step=step))
                summary.update(warmed)
            journal = step_curve.StepJournal(checkpoints)
            trainer = stage_trainer("sft", sft, policy, params, env_params, checkpoints,
                                    metrics_callback=journal.callback(
                                        lambda step, metrics: run.log_metrics(metrics, step=step)))
            params = trainer.run()
            recent = trainer.restored_history + trainer.history
            last = recent[-1] if recent else {}
            summary.update({"final_loss": last.get("loss"), "resumed_from": trainer.resumed_from,
                            "checkpoints": str(checkpoints), **selection_summary(trainer)})
            curve = journal.entries()
        out = save_model(sft.out_dir, policy, params, sft.init_dir, sft.lora.dropout)
        # Results only: where a run resumed from is MLflow's to know, so a killed and resumed run writes the
        # same bytes as an uninterrupted one.
        write_json_atomically(METRICS_FILE, {k: v for k, v in summary.items()
                                             if isinstance(v, int | float) and k != "resumed_from"})
        step_curve.write_curve(CURVE_FILE, curve)
        run.log_dict(summary, "sft.json")
    print(f"sft: {sft.init_dir} -> {out} ({sft.steps} steps"
          + (f", final loss {summary['final_loss']:.4f})" if summary.get("final_loss") is not None else ")"))
    return 0


if __name__ == "__main__":
    from vlmgym.runtime.errors import guarded

    sys.exit(guarded("sft", main))
