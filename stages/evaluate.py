"""evaluate stage: metrics with bootstrap intervals, the HF baseline, plots and reports -> metrics/, reports/.

Reads the rollout JSONL of every policy (outputs/rollouts/<policy>.jsonl, greedy answers) and writes
metrics/eval.json (each policy's metrics with `_ci_low`/`_ci_high`, the paired `grpo_minus_sft` differences and
the `hf_baseline` figures), metrics/plots/*.csv (DVC plots: distance CDF per policy, training reward curve),
reports/eval.md, reports/eval.html and the PNGs. The HF baseline runs transformers on the exported folder
(models/hf/grpo) over the first `eval.hf_samples` test prompts and compares with the JAX engine's greedy answers.
The training reward curve comes from the MLflow train run that wrote the evaluated model (vlmgym.eval.curve).
`env.name` picks the metrics: geolocation (geospot) or accuracy (nlvr2).

    python stages/evaluate.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vlmgym import tracking
from vlmgym.data.shards import read_split
from vlmgym.eval.curve import train_reward_curve
from vlmgym.eval.hf_baseline import run_hf_baseline
from vlmgym.eval.outputs import mlflow_metrics, write_evaluation
from vlmgym.eval.records import read_jsonl
from vlmgym.eval.rollouts import make_eval_env
from vlmgym.params import EnvParams, EvalParams, ModelParams, ParamsError, RolloutParams, load_section


def read_rollouts(rollouts_dir: str | Path, policies: list[str]) -> dict[str, list[dict]]:
    """{policy: greedy records}, each file checked to hold one record per sample of that policy."""
    out = {}
    for policy in policies:
        path = Path(rollouts_dir) / f"{policy}.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no rollouts for policy {policy!r} (run the rollout stage)")
        records = read_jsonl(path)
        if not records:
            raise ValueError(f"{path}: no records")
        wrong = [i for i, r in enumerate(records, start=1) if r.get("policy") != policy]
        if wrong:
            raise ValueError(f"{path}:{wrong[0]}: record of policy {records[wrong[0] - 1].get('policy')!r}, "
                             f"expected {policy!r}")
        out[policy] = records
    return out


def hf_baseline(eval_params: EvalParams, rollout: RolloutParams, model: ModelParams, env_params: EnvParams,
                records: list[dict]) -> dict[str, float]:
    """The HF-baseline figures on the first eval.hf_samples test samples the hf_policy answered."""
    from vlmgym.models.qwen3_vl.processor import Processor

    chosen = records[: eval_params.hf_samples]
    processor = Processor.from_pretrained(eval_params.hf_dir)
    env = make_eval_env(env_params, rollout.shards_dir, rollout.split, rollout.limit, processor.tokenizer,
                        rollout.progress)
    index = {sample.key: i for i, sample in enumerate(env.samples)}
    missing = [r["id"] for r in chosen if r["id"] not in index]
    if missing:
        raise ValueError(f"rollout ids {missing[:5]} are not in {rollout.shards_dir}/{rollout.split}")
    observations = [env.reset(index[r["id"]])[1] for r in chosen]
    figures = run_hf_baseline(eval_params.hf_dir, Path(rollout.models_dir) / eval_params.hf_policy, observations,
                              [r["tokens"] for r in chosen], max_new_tokens=rollout.max_new_tokens,
                              batch_size=rollout.batch_size, logit_samples=eval_params.logit_samples,
                              dtype=model.dtype)
    summary_path = Path(eval_params.rollouts_dir) / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text()).get(eval_params.hf_policy, {})
        if "tokens_per_s" in summary:
            figures["jax_tokens_per_s"] = float(summary["tokens_per_s"])
    return figures


def main(argv: list[str] | None = None) -> int:
    """Evaluate every policy, write metrics, plots and reports, log one MLflow run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (sections eval, rollout, env, ...)")
    args = parser.parse_args(argv)
    eval_params = load_section("eval", args.params)
    rollout = load_section("rollout", args.params)
    model = load_section("model", args.params)
    env_params = load_section("env", args.params)
    train = load_section("train", args.params)
    tracking_params = load_section("tracking", args.params)
    comparisons = [tuple(pair) for pair in eval_params.comparisons]
    if any(len(pair) != 2 for pair in comparisons):
        raise ParamsError(f"{args.params}: eval.comparisons must be [treatment, control] pairs, "
                          f"got {eval_params.comparisons}")
    logged = {"env.name": env_params.name, "rollout.policies": rollout.policies}
    with tracking.stage_run("evaluate", eval_params, extra_params=logged, params_file=args.params) as run:
        records = read_rollouts(eval_params.rollouts_dir, rollout.policies)
        extra = {}
        if eval_params.hf_samples > 0:
            if eval_params.hf_policy not in records:
                raise ParamsError(f"{args.params}: eval.hf_policy {eval_params.hf_policy!r} is not among "
                                  f"rollout.policies {rollout.policies}")
            extra["hf_baseline"] = hf_baseline(eval_params, rollout, model, env_params,
                                               records[eval_params.hf_policy])
        curve, train_run = train_reward_curve(train.out_dir, eval_params.reward_curve_metric,
                                              tracking_uri=tracking.tracking_uri(tracking_params.tracking_uri),
                                              experiment=tracking_params.experiment)
        if not curve:
            print(f"evaluate: no MLflow train run wrote {train.out_dir} as it is now: no training reward curve",
                  file=sys.stderr)
        ids = {r["id"] for recs in records.values() for r in recs}
        images = {s.key: s.images for s in read_split(rollout.shards_dir, rollout.split, rollout.limit or None)
                  if s.key in ids}
        outputs = write_evaluation(env_params.name, records, images=images, out_root=".", reward_curve=curve or None,
                                   comparisons=comparisons, n_resamples=eval_params.n_resamples,
                                   seed=eval_params.seed, confidence=eval_params.confidence,
                                   max_samples=eval_params.gallery_samples or None,
                                   map_base_points=eval_params.map_base_points, extra_metrics=extra)
        run.log_metrics(mlflow_metrics(outputs.results))
        if train_run:
            run.set_tags({"vlmgym.train_run_id": train_run})
        for path in outputs.files.values():
            run.log_artifact(path, artifact_path="plots" if path.suffix in (".png", ".csv") else "report")
    print(outputs.files["table"].read_text())
    print(f"evaluate: wrote {', '.join(str(p) for p in outputs.files.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
