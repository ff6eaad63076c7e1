"""rollout stage: each policy (base, sft, grpo) answers the test split -> outputs/rollouts/<policy>.jsonl.

Greedy answers (the headline numbers) with the rollout engine in batches of `rollout.batch_size`, scored by the
env at curriculum progress `rollout.progress`; with `rollout.sampled_answers: k > 0` also k sampled answers per
prompt in <policy>.sampled.jsonl. One record per answer (schema: vlmgym.eval.records and vlmgym.eval.rollouts);
When the shards hold the env's out-of-distribution split (`rollout.ood_split`, test_ood), each policy also answers
it, greedy, into test_ood/<policy>.jsonl. summary.json holds each policy's counts, mean reward and format rate;
a mixture of envs (env.name: mixture) answers each sub-env's splits into <name>/<policy>.jsonl and
<name>/test_ood/<policy>.jsonl, and its summary.json holds {name: {policy: figures}}. Speeds (seconds,
tokens/s) go to the MLflow run only, so the folder is the same bytes on every run. The folder is replaced as a
whole, atomically.

    python stages/rollout.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

from vlmgym import envs, tracking
from vlmgym.atomic import atomic_dir
from vlmgym.eval.records import write_jsonl
from vlmgym.eval.rollouts import answer_split, load_engine
from vlmgym.params import load_section
from vlmgym.rollout import RolloutEngine


def part_envs(rollout: Any, env_params: Any, shards_dir: str, tokenizer: Any) -> tuple[Any, Any]:
    """The env over the answered split and, when the shards hold it, over the out-of-distribution split (else None)."""
    env = envs.from_params(env_params, shards_dir=shards_dir, split=rollout.split, tokenizer=tokenizer,
                           limit=rollout.limit, progress=rollout.progress)
    if not rollout.ood_split:
        return env, None
    if not (Path(shards_dir) / rollout.ood_split).is_dir():
        print(f"rollout: {shards_dir} holds no {rollout.ood_split} split (the env's generator wrote none, or "
              "data.ood_images is 0): in-distribution answers only")
        return env, None
    return env, envs.from_params(env_params, shards_dir=shards_dir, split=rollout.ood_split, tokenizer=tokenizer,
                                 limit=rollout.limit, progress=rollout.progress)


def answer_policy(rollout: Any, engine: Any, params: Any, env: Any, ood_env: Any, policy: str, number: int,
                  out: Path) -> tuple[dict[str, float], dict[str, float]]:
    """One policy's answers to one env's splits written under `out`: (figures for summary.json, speeds)."""
    records, timing = answer_split(engine, params, env, policy=policy, batch_size=rollout.batch_size)
    write_jsonl(out / f"{policy}.jsonl", records)
    figures = {**timing.counts(), "mean_reward": float(np.mean([r["reward"] for r in records])),
               "format_ok_rate": float(np.mean([r["format_ok"] for r in records]))}
    speed = timing.speed()
    if ood_env is not None:
        ood = rollout.ood_split
        ood_records, ood_timing = answer_split(engine, params, ood_env, policy=policy, batch_size=rollout.batch_size)
        write_jsonl(out / ood / f"{policy}.jsonl", ood_records)
        figures[f"{ood}_mean_reward"] = float(np.mean([r["reward"] for r in ood_records]))
        figures[f"{ood}_samples"] = ood_timing.samples
        speed[f"{ood}_tokens_per_s"] = ood_timing.tokens_per_s
    if rollout.sampled_answers > 0:
        engine = RolloutEngine(engine.cfg, engine.processor,
                               replace(engine.settings, greedy=False, temperature=rollout.temperature))
        key = jax.random.fold_in(jax.random.key(rollout.seed), number)
        sampled, sampled_timing = answer_split(engine, params, env, policy=policy, batch_size=rollout.batch_size,
                                               group_size=rollout.sampled_answers, key=key)
        write_jsonl(out / f"{policy}.sampled.jsonl", sampled)
        figures["sampled_mean_reward"] = float(np.mean([r["reward"] for r in sampled]))
        speed["sampled_tokens_per_s"] = sampled_timing.tokens_per_s
    return figures, speed


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
    summary: dict[str, dict] = {}
    logged = {"model.dtype": model.dtype, "model.param_dtype": model.param_dtype, "env.name": env_params.name}
    # (name, env params, shards folder, output subfolder): the env itself, or each sub-env of a mixture, whose
    # shards are in <shards_dir>/<name>/ and whose rollouts go to <out_dir>/<name>/
    parts = ([(name, envs.part_params(env_params, name), f"{rollout.shards_dir}/{name}", name)
              for name in envs.parts(env_params)] if envs.has_parts(env_params)
             else [("", env_params, rollout.shards_dir, "")])
    with tracking.stage_run("rollout", rollout, extra_params=logged, params_file=args.params) as run:
        with atomic_dir(Path(rollout.out_dir)) as tmp:
            built: dict[str, tuple] = {}
            for number, policy in enumerate(rollout.policies):
                model_dir = Path(rollout.models_dir) / policy
                engine, params = load_engine(model_dir, max_new_tokens=rollout.max_new_tokens, dtype=model.dtype,
                                             param_dtype=model.param_dtype)
                for name, part_env, shards_dir, folder in parts:
                    if name not in built:  # one env for every policy: they share the tokenizer of the base model
                        built[name] = part_envs(rollout, part_env, shards_dir, engine.processor.tokenizer)
                    env, ood_env = built[name]
                    figures, speed = answer_policy(rollout, engine, params, env, ood_env, policy, number,
                                                   tmp / folder)
                    summary.setdefault(name, {})[policy] = figures
                    prefix = f"{name}/" if name else ""
                    run.log_metrics({f"{prefix}{policy}/{k}": v for k, v in {**figures, **speed}.items()})
                    ood = rollout.ood_split if ood_env is not None else ""
                    print(f"rollout: {prefix}{policy}: {figures['samples']} samples, mean reward "
                          f"{figures['mean_reward']:.4f}, format ok {figures['format_ok_rate']:.1%}, "
                          f"{speed['tokens_per_s']:.0f} tokens/s"
                          + (f"; {ood}: mean reward {figures[f'{ood}_mean_reward']:.4f}" if ood else ""))
            summary = summary.get("", summary)  # one env: {policy: figures}, as before mixtures
            (tmp / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        run.log_dict(summary, "rollout_summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
