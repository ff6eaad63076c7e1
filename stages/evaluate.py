"""evaluate stage: metrics with bootstrap intervals, the HF baseline, plots and reports -> metrics/, reports/.

Reads the rollout JSONL of every policy (outputs/rollouts/<policy>.jsonl, greedy answers) and writes
metrics/eval.json (each policy's metrics with `_ci_low`/`_ci_high`, the paired `grpo_minus_sft` differences and
the `hf_baseline` figures; the baseline's speed goes to the MLflow run only, as it differs on every run),
metrics/headline.json (a few of those figures, the pipeline's DVC metrics: vlmgym.eval.outputs.headline_figures),
metrics/plots/*.csv (plot data: distance CDF per policy, training reward curve),
reports/eval.md, reports/eval.html and the PNGs, among them reports/curves_sft.png and curves_train.png (loss,
reward, validation reward, KL and entropy per step, from metrics/curves/: vlmgym.eval.curve). dvc.yaml's plots are
the images, which `dvc plots show` embeds without loading vega from the network. The HF baseline runs transformers
on the exported folder (models/hf/grpo) over the first `eval.hf_samples` test prompts and compares with the JAX
engine's greedy answers. The evaluate run logs every figure; the pipeline's parent run gets the headline ones.
The training curves come from the train stage's per-step figures, metrics/curves/train.jsonl (vlmgym.eval.curve),
a DVC output of the train stage and a dep of this one: the report depends on DVC-tracked files only, never on the
MLflow store. The evaluate run's lineage tags link it to the train run that wrote the evaluated model: its
`dvc.dep.models/jax/grpo` equals that run's `dvc.out.models/jax/grpo`.
`env.name` picks the env, whose metrics, plots and report section these are.

    python stages/evaluate.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import sys

from vlmgym.eval.curve import write_training_curve_pngs
from vlmgym.eval.evaluate import evaluate_pipeline
from vlmgym.eval.outputs import headline_metrics, headline_summary, headline_values, mlflow_metrics
from vlmgym.params import load_section
from vlmgym.runtime.collector import collect_less
from vlmgym.tracking import model_registry as registry
from vlmgym.tracking import stage_runs as tracking
from vlmgym.tracking.step_curve import curve_file


def main(argv: list[str] | None = None) -> int:
    """Evaluate every policy, write metrics, plots and reports, log one MLflow run."""
    collect_less()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (sections eval, rollout, env, ...)")
    args = parser.parse_args(argv)
    eval_params = load_section("eval", args.params)
    rollout = load_section("rollout", args.params)
    model = load_section("model", args.params)
    env_params = load_section("env", args.params)
    data = load_section("data", args.params)
    logged = {"env.name": env_params.name, "rollout.policies": rollout.policies}
    with tracking.stage_run("evaluate", eval_params, extra_params=logged, params_file=args.params) as run:
        outputs, hf_timing = evaluate_pipeline(eval_params, rollout, model, env_params, curve_file("train"),
                                               data=data)
        run.log_metrics(mlflow_metrics(outputs.results))
        # The parent's row in MLflow's table: the headline figures, under the names this run logs them by
        run.log_pipeline_results(headline_metrics(outputs))
        run.log_metrics({f"hf_baseline/{name}": value for name, value in hf_timing.items()})
        curve_pngs = write_training_curve_pngs({stage: curve_file(stage) for stage in ("sft", "train")})
        for path in [*outputs.files.values(), *curve_pngs.values()]:
            run.log_artifact(path, artifact_path="plots" if path.suffix in (".png", ".csv") else "report")
        # The `champion` alias of vlmgym-<env> moves to the evaluated export when its mean reward beats the champion's.
        registry.promote_evaluated(run, env_params.name, eval_params.hf_dir, eval_params.hf_policy, outputs.results)
    print(headline_summary(headline_values(outputs.results, outputs.headline), outputs.files["table"]))
    print(f"evaluate: wrote {', '.join(str(p) for p in [*outputs.files.values(), *curve_pngs.values()])}")
    return 0


if __name__ == "__main__":
    from vlmgym.runtime.errors import guarded

    sys.exit(guarded("evaluate", main))
