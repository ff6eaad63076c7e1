"""rollout stage: each policy (base, sft, grpo) answers the test split -> outputs/rollouts/<policy>.jsonl.

Greedy answers (the headline numbers) with the rollout engine in batches of `rollout.batch_size`, scored by the
env at curriculum progress `rollout.progress`; with `rollout.sampled_answers: k > 0` also k sampled answers per
prompt in <policy>.sampled.jsonl. One record per answer (schema: vlmgym.eval.records and vlmgym.eval.rollouts);
When the shards hold the env's out-of-distribution split (`rollout.ood_split`, test_ood), each policy also answers
it, greedy, into test_ood/<policy>.jsonl. The image-blind baselines (vlmgym.eval.blind) answer the same splits:
each of `rollout.blind_policies` again with its images blanked, as <policy>_blind.jsonl, and with
`rollout.constant_baseline` the best constant answer chosen on the val split, as constant.jsonl. summary.json
holds each policy's counts, mean reward and format rate; a mixture of envs (env.name: mixture) answers each
sub-env's splits into <name>/<policy>.jsonl and <name>/test_ood/<policy>.jsonl, and its summary.json holds
{name: {policy: figures}}. Speeds (seconds, tokens/s) go to the MLflow run only, so the folder is the same bytes
on every run. The folder is replaced as a whole, atomically.

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

from vlmgym import envs
from vlmgym.config import EnvParams, RolloutParams
from vlmgym.eval import blind
from vlmgym.eval.records import write_jsonl
from vlmgym.eval.rollouts import answer_split, load_engine
from vlmgym.params import load_section
from vlmgym.rollout import RolloutEngine
from vlmgym.runtime.atomic import atomic_dir
from vlmgym.runtime.collector import collect_less
from vlmgym.tracking import stage_runs as tracking


def part_envs(rollout: RolloutParams, env_params: EnvParams, shards_dir: str, tokenizer: Any) -> tuple[Any, Any]:
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


def answer_greedy(rollout: RolloutParams, engine: Any, params: Any, env: Any, ood_env: Any, name: str, out: Path,
                  blank_images: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Greedy answers to the split (and the out-of-distribution split) as the policy `name` under `out`."""
    records, timing = answer_split(engine, params, env, policy=name, batch_size=rollout.batch_size,
                                   blank_images=blank_images)
    write_jsonl(out / f"{name}.jsonl", records)
    figures = {**timing.counts(), **reward_figures(records)}
    speed = timing.speed()
    if ood_env is not None:
        ood = rollout.ood_split
        ood_records, ood_timing = answer_split(engine, params, ood_env, policy=name, batch_size=rollout.batch_size,
                                               blank_images=blank_images)
        write_jsonl(out / ood / f"{name}.jsonl", ood_records)
        figures[f"{ood}_mean_reward"] = float(np.mean([r["reward"] for r in ood_records]))
        figures[f"{ood}_samples"] = ood_timing.samples
        speed[f"{ood}_tokens_per_s"] = ood_timing.tokens_per_s
    return figures, speed


def reward_figures(records: list[dict]) -> dict[str, float]:
    return {"mean_reward": float(np.mean([r["reward"] for r in records])),
            "format_ok_rate": float(np.mean([r["format_ok"] for r in records]))}


def answer_policy(rollout: RolloutParams, engine: Any, params: Any, env: Any, ood_env: Any, policy: str, number: int,
                  out: Path) -> tuple[dict[str, float], dict[str, float]]:
    """One policy's answers to one env's splits written under `out`: (figures for summary.json, speeds)."""
    figures, speed = answer_greedy(rollout, engine, params, env, ood_env, policy, out)
    if rollout.sampled_answers > 0:
        engine = RolloutEngine(engine.cfg, engine.processor,
                               replace(engine.settings, greedy=False, temperature=rollout.sampling.temperature,
                                       top_k=rollout.sampling.top_k, top_p=rollout.sampling.top_p))
        key = jax.random.fold_in(jax.random.key(rollout.seed), number)
        sampled, sampled_timing = answer_split(engine, params, env, policy=policy, batch_size=rollout.batch_size,
                                               group_size=rollout.sampled_answers, key=key)
        write_jsonl(out / f"{policy}.sampled.jsonl", sampled)
        figures["sampled_mean_reward"] = float(np.mean([r["reward"] for r in sampled]))
        speed["sampled_tokens_per_s"] = sampled_timing.tokens_per_s
    return figures, speed


def answer_constant(rollout: RolloutParams, env_params: EnvParams, shards_dir: str, env: Any, ood_env: Any,
                    out: Path) -> dict[str, Any] | None:
    """The constant baseline (vlmgym.eval.blind): chosen on the val split (train's first samples without one),
    written as the policy `constant`; None (with a note) when the env has no ideal answer to propose."""

    def open_env(split: str, limit: int | None) -> Any:
        return envs.from_params(env_params, shards_dir=shards_dir, split=split, tokenizer=env.tokenizer, limit=limit,
                                progress=rollout.progress)

    chosen = blind.choose_constant(open_env, shards_dir, rollout.constant_candidates)
    if chosen is None:
        print(f"rollout: {env.name} has no ideal answer to propose as a constant: no constant baseline")
        return None
    answer, chosen_reward, split, candidates = chosen
    records = blind.constant_records(env, answer)
    write_jsonl(out / f"{blind.CONSTANT}.jsonl", records)
    figures: dict[str, Any] = {"answer": answer, "candidates": candidates, "chosen_on": split,
                               f"{split}_mean_reward": chosen_reward, "samples": len(records),
                               **reward_figures(records)}
    if ood_env is not None:
        ood_records = blind.constant_records(ood_env, answer)
        write_jsonl(out / rollout.ood_split / f"{blind.CONSTANT}.jsonl", ood_records)
        figures[f"{rollout.ood_split}_mean_reward"] = float(np.mean([r["reward"] for r in ood_records]))
    return figures


def report(run: Any, name: str, policy: str, figures: dict[str, float], speed: dict[str, float], ood: str) -> None:
    """Log one policy's figures to MLflow and print them."""
    prefix = f"{name}/" if name else ""
    run.log_metrics({f"{prefix}{policy}/{k}": v for k, v in {**figures, **speed}.items()})
    print(f"rollout: {prefix}{policy}: {figures['samples']} samples, mean reward "
          f"{figures['mean_reward']:.4f}, format ok {figures['format_ok_rate']:.1%}"
          + (f", {speed['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in speed else "")
          + (f"; {ood}: mean reward {figures[f'{ood}_mean_reward']:.4f}" if ood else ""))


def main(argv: list[str] | None = None) -> int:
    """Roll out every policy, write the JSONL folder atomically and log one MLflow run."""
    collect_less()
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
                    answered = [(policy, figures, speed)]
                    if policy in rollout.blind_policies:
                        blind_figures, blind_speed = answer_greedy(rollout, engine, params, env, ood_env,
                                                                   blind.blind_name(policy), tmp / folder,
                                                                   blank_images=True)
                        answered.append((blind.blind_name(policy), blind_figures, blind_speed))
                    for answered_as, answer_figures, answer_speed in answered:
                        summary.setdefault(name, {})[answered_as] = answer_figures
                        report(run, name, answered_as, answer_figures, answer_speed,
                               rollout.ood_split if ood_env is not None else "")
            if rollout.constant_baseline:
                for name, part_env, shards_dir, folder in parts:
                    env, ood_env = built[name]
                    figures = answer_constant(rollout, part_env, shards_dir, env, ood_env, tmp / folder)
                    if figures is not None:
                        summary.setdefault(name, {})[blind.CONSTANT] = figures
                        report(run, name, blind.CONSTANT, {k: v for k, v in figures.items()
                                                           if isinstance(v, int | float)}, {},
                               rollout.ood_split if ood_env is not None else "")
                        print(f"rollout: {name or env.name}: constant answer {figures['answer']!r} (best of "
                              f"{figures['candidates']} on {figures['chosen_on']})")
            summary = summary.get("", summary)  # one env: {policy: figures}, as before mixtures
            (tmp / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        run.log_dict(summary, "rollout_summary.json")
    return 0


if __name__ == "__main__":
    from vlmgym.runtime.errors import guarded

    sys.exit(guarded("rollout", main))
