"""rollout stage: each policy (base, sft, grpo) answers the test split -> outputs/rollouts/<policy>.jsonl.

Greedy answers (the headline numbers) with the rollout engine in batches of `rollout.batch_size`, scored by the
env at curriculum progress `rollout.progress`; with `rollout.sampled_answers: k > 0` also k sampled answers per
prompt in <policy>.sampled.jsonl. One record per answer (schema: vlmgym.eval.records and vlmgym.eval.rollouts);
When the shards hold the env's out-of-distribution split (`rollout.ood_split`, test_ood), each policy also answers
it, greedy, into test_ood/<policy>.jsonl. summary.json holds each policy's counts, mean reward and format rate;
speeds (seconds, tokens/s) go to the MLflow run only, so the folder is the same bytes on every run. The folder is
replaced as a whole, atomically.

    python stages/rollout.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np

from vlmgym import envs, tracking
from vlmgym.atomic import atomic_dir
from vlmgym.eval.records import write_jsonl
from vlmgym.eval.rollouts import answer_split, load_engine
from vlmgym.params import load_section
from vlmgym.rollout import RolloutEngine


def main(argv: list[str] | None = None) -> int:
    """Roll out every policy, write the JSONL folder atomically and log one MLflow run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (sections rollout, model, env)")
    args = parser.parse_args(argv)
    rollout = load_section("rollout", args.params)
    model = load_section("model", args.params)
    env_params = load_section("env", args.params)
    if not rollout.policies or len(set(rollout.policies)) != len(rollout.policies):
        print(f"rollout: policies must be distinct and not empty, got {rollout.policies}", file=sys.stderr)
        return 1
    summary: dict[str, dict[str, float]] = {}
    logged = {"model.dtype": model.dtype, "model.param_dtype": model.param_dtype, "env.name": env_params.name}
    ood = rollout.ood_split if rollout.ood_split and (Path(rollout.shards_dir) / rollout.ood_split).is_dir() else ""
    if rollout.ood_split and not ood:
        print(f"rollout: {rollout.shards_dir} holds no {rollout.ood_split} split (the env's generator wrote none, or "
              "data.ood_images is 0): in-distribution answers only")
    with tracking.stage_run("rollout", rollout, extra_params=logged, params_file=args.params) as run:
        with atomic_dir(Path(rollout.out_dir)) as tmp:
            env = ood_env = None
            for number, policy in enumerate(rollout.policies):
                model_dir = Path(rollout.models_dir) / policy
                engine, params = load_engine(model_dir, max_new_tokens=rollout.max_new_tokens, dtype=model.dtype,
                                             param_dtype=model.param_dtype)
                if env is None:  # one env for every policy: they share the tokenizer of the base model
                    env = envs.from_params(env_params, shards_dir=rollout.shards_dir, split=rollout.split,
                                           tokenizer=engine.processor.tokenizer, limit=rollout.limit,
                                           progress=rollout.progress)
                records, timing = answer_split(engine, params, env, policy=policy, batch_size=rollout.batch_size)
                write_jsonl(tmp / f"{policy}.jsonl", records)
                figures = {**timing.counts(), "mean_reward": float(np.mean([r["reward"] for r in records])),
                           "format_ok_rate": float(np.mean([r["format_ok"] for r in records]))}
                speed = timing.speed()
                if ood:
                    if ood_env is None:
                        ood_env = envs.from_params(env_params, shards_dir=rollout.shards_dir, split=ood,
                                                   tokenizer=env.tokenizer, limit=rollout.limit,
                                                   progress=rollout.progress)
                    ood_records, ood_timing = answer_split(engine, params, ood_env, policy=policy,
                                                           batch_size=rollout.batch_size)
                    write_jsonl(tmp / ood / f"{policy}.jsonl", ood_records)
                    figures[f"{ood}_mean_reward"] = float(np.mean([r["reward"] for r in ood_records]))
                    figures[f"{ood}_samples"] = ood_timing.samples
                    speed[f"{ood}_tokens_per_s"] = ood_timing.tokens_per_s
                if rollout.sampled_answers > 0:
                    engine = RolloutEngine(engine.cfg, engine.processor,
                                           replace(engine.settings, greedy=False, temperature=rollout.temperature))
                    key = jax.random.fold_in(jax.random.key(rollout.seed), number)
                    sampled, sampled_timing = answer_split(engine, params, env, policy=policy,
                                                           batch_size=rollout.batch_size,
                                                           group_size=rollout.sampled_answers, key=key)
                    write_jsonl(tmp / f"{policy}.sampled.jsonl", sampled)
                    figures["sampled_mean_reward"] = float(np.mean([r["reward"] for r in sampled]))
                    speed["sampled_tokens_per_s"] = sampled_timing.tokens_per_s
                summary[policy] = figures
                run.log_metrics({f"{policy}/{k}": v for k, v in {**figures, **speed}.items()})
                print(f"rollout: {policy}: {timing.samples} samples, mean reward {figures['mean_reward']:.4f}, "
                      f"format ok {figures['format_ok_rate']:.1%}, {speed['tokens_per_s']:.0f} tokens/s"
                      + (f"; {ood}: mean reward {figures[f'{ood}_mean_reward']:.4f}" if ood else ""))
            (tmp / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        run.log_dict(summary, "rollout_summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
