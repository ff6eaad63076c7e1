"""The evaluate stage's library: read every policy's rollouts, run the HF baseline, draw the training reward
curves from the train stage's curve file (vlmgym.eval.curve), and write metrics, plots and reports with the env's
metrics and report section."""

from __future__ import annotations

import sys
from pathlib import Path

from vlmgym import envs
from vlmgym.data.shards import open_split
from vlmgym.eval.blind import CONSTANT, baseline_policies
from vlmgym.eval.curve import reward_curves
from vlmgym.eval.hf_baseline import run_hf_baseline
from vlmgym.eval.outputs import EvaluationOutputs, write_evaluation
from vlmgym.eval.parts import evaluate_parts
from vlmgym.eval.records import read_jsonl
from vlmgym.eval.sampled import attach_sampled
from vlmgym.params import DataParams, EnvParams, EvalParams, ModelParams, ParamsError, RolloutParams


def read_ood_rollouts(rollouts_dir: str | Path, policies: list[str],
                      split: str) -> dict[str, list[dict]]:
    """{policy: greedy records} of the out-of-distribution split (`<rollouts>/<split>/<policy>.jsonl`, written
    when the shards hold it); empty when the rollout stage wrote none."""
    folder = Path(rollouts_dir) / split
    return read_rollouts(folder, policies) if split and folder.is_dir() else {}


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


def with_sampled(env: type, rollouts_dir: str | Path,
                 records_by_policy: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Each policy's greedy records with its sampled answers' summary (vlmgym.eval.sampled) where the rollout stage
    wrote `<policy>.sampled.jsonl`."""
    out = {}
    for policy, records in records_by_policy.items():
        path = Path(rollouts_dir) / f"{policy}.sampled.jsonl"
        out[policy] = attach_sampled(env, records, read_jsonl(path), where=str(path)) if path.exists() else records
    return out


def read_baselines(rollouts_dir: str | Path, rollout: RolloutParams) -> dict[str, list[dict]]:
    """{baseline: records} of the image-blind baselines the rollout settings ask for (vlmgym.eval.blind) in
    `rollouts_dir`; the constant is left out where the rollout stage proposed none (an env without ideal answers)."""
    names = [name for name in baseline_policies(rollout)
             if name != CONSTANT or (Path(rollouts_dir) / f"{CONSTANT}.jsonl").exists()]
    return read_rollouts(rollouts_dir, names) if Path(rollouts_dir).is_dir() else {}


def hf_baseline(eval_params: EvalParams, rollout: RolloutParams, model: ModelParams, env_params: EnvParams,
                records: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """The HF-baseline figures on the first eval.hf_samples test samples the hf_policy answered, and the timing
    of transformers' generate on them, which differs on every run: it goes to the evaluate stage's MLflow run,
    not into metrics/eval.json (a DVC output, whose hash must only change when a result does)."""
    from vlmgym.models.qwen3_vl.processor import Processor

    chosen = records[: eval_params.hf_samples]
    processor = Processor.from_pretrained(eval_params.hf_dir)
    env = envs.from_params(env_params, shards_dir=rollout.shards_dir, split=rollout.split,
                           tokenizer=processor.tokenizer, limit=rollout.limit, progress=rollout.progress)
    index = {sample.key: i for i, sample in enumerate(env.samples)}
    missing = [r["id"] for r in chosen if r["id"] not in index]
    if missing:
        raise ValueError(f"rollout ids {missing[:5]} are not in {rollout.shards_dir}/{rollout.split}")
    observations = [env.reset(index[r["id"]])[1] for r in chosen]
    return run_hf_baseline(eval_params.hf_dir, Path(rollout.models_dir) / eval_params.hf_policy, observations,
                           [r["tokens"] for r in chosen], max_new_tokens=rollout.max_new_tokens,
                           batch_size=rollout.batch_size, logit_samples=eval_params.logit_samples,
                           dtype=model.dtype)


def evaluate_pipeline(eval_params: EvalParams, rollout: RolloutParams, model: ModelParams, env_params: EnvParams,
                      train_curve: str | Path, out_root: str | Path = ".", curve_prefix: str = "",
                      data: DataParams | None = None) -> tuple[EvaluationOutputs, dict[str, float]]:
    """Everything the evaluate stage computes and writes; returns the outputs and the HF baseline's timing (empty
    without the baseline), which is for MLflow only. The training curves come from `train_curve`, the train stage's
    curve file (vlmgym.tracking.step_curve). An env made of several is evaluated per sub-env (vlmgym.eval.parts);
    `curve_prefix` reads the training curves under that prefix (a sub-env's own). `data`, the settings the splits
    were generated with, names the out-of-distribution shift in the reports."""
    if envs.has_parts(env_params):
        return evaluate_parts(eval_params, rollout, model, env_params, train_curve, evaluate_env, out_root, data)
    return evaluate_env(eval_params, rollout, model, env_params, train_curve, out_root, curve_prefix, data)


def evaluate_env(eval_params: EvalParams, rollout: RolloutParams, model: ModelParams, env_params: EnvParams,
                 train_curve: str | Path, out_root: str | Path = ".", curve_prefix: str = "",
                 data: DataParams | None = None) -> tuple[EvaluationOutputs, dict[str, float]]:
    """evaluate_pipeline for an env that is not made of several (its arguments and what it returns)."""
    env = envs.env_class(env_params.name)
    records = with_sampled(env, eval_params.rollouts_dir, read_rollouts(eval_params.rollouts_dir, rollout.policies))
    extra, timing = {}, {}
    if eval_params.hf_samples > 0:
        if eval_params.hf_policy not in records:
            raise ParamsError(f"eval.hf_policy {eval_params.hf_policy!r} is not among rollout.policies "
                              f"{rollout.policies}")
        extra["hf_baseline"], timing = hf_baseline(eval_params, rollout, model, env_params,
                                                   records[eval_params.hf_policy])
    curves = reward_curves(env, train_curve, eval_params.reward_curve_metric, prefix=curve_prefix)
    if not curves.total:
        why = ("holds no " + curve_prefix + eval_params.reward_curve_metric if Path(train_curve).is_file()
               else "does not exist (the train stage writes it)")
        print(f"evaluate: {train_curve} {why}: no training reward curve", file=sys.stderr)
    ids = {r["id"] for recs in records.values() for r in recs}
    image_exts = env.schema.image_exts if env.schema is not None else None
    images = {s.key: s.images for s in open_split(rollout.shards_dir, rollout.split, rollout.limit or None,
                                                  image_exts=image_exts) if s.key in ids}
    outputs = write_evaluation(env, records, images=images, out_root=out_root, reward_curve=curves,
                               comparisons=[tuple(pair) for pair in eval_params.comparisons],
                               n_resamples=eval_params.n_resamples, seed=eval_params.seed,
                               confidence=eval_params.confidence, max_samples=eval_params.gallery_samples or None,
                               env_params=env_params.settings(), extra_metrics=extra,
                               start_policies=start_policies(rollout, model),
                               ood_records_by_policy=read_ood_rollouts(eval_params.rollouts_dir, rollout.policies,
                                                                       rollout.ood_split),
                               ood_split=rollout.ood_split, in_split=rollout.split, ood_note=env.ood_description(data),
                               baseline_records=read_baselines(eval_params.rollouts_dir, rollout),
                               ood_baseline_records=read_baselines(Path(eval_params.rollouts_dir) / rollout.ood_split,
                                                                   rollout) if rollout.ood_split else {})
    for warning in outputs.warnings:
        print(f"evaluate: WARNING: {warning}", file=sys.stderr)
    return outputs, timing


def start_policies(rollout: RolloutParams, model: ModelParams) -> list[str]:
    """The policies whose folder is the converted, untrained model (model.jax_dir): a random model answering one
    thing everywhere is no news, so the collapse check does not warn about them."""
    start = Path(model.jax_dir).resolve()
    return [p for p in rollout.policies if (Path(rollout.models_dir) / p).resolve() == start]
