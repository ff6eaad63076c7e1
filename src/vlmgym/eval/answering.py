"""Answering: every policy answers the held-out splits of the configured env, as the rollout stage writes them.

    summary = answer_policies(rollout, model, env_params, out=Path("outputs/rollouts"), on_answered=log)

For each policy of `rollout.policies` (the JAX model folder `<rollout.models_dir>/<policy>`) and each env answered
(the configured env, or each part of an env made of several: `env_parts`):
- greedy answers to `rollout.split` as <policy>.jsonl (the headline numbers), and to the out-of-distribution split
  `rollout.ood_split`, when the shards hold it, as <ood>/<policy>.jsonl;
- with `rollout.sampled_answers: k > 0`, k sampled answers per prompt of `rollout.split` as <policy>.sampled.jsonl;
- for each of `rollout.blind_policies`, the same greedy answers with every image blanked, as <policy>_blind.jsonl
  (vlmgym.eval.blind);
then, with `rollout.constant_baseline`, the best constant answer chosen on the val split as constant.jsonl. A
part `<name>` of an env made of several reads its shards from <shards_dir>/<name>/ and writes under <out>/<name>/.

What each policy scored comes back as an `Answered` (counts, mean reward, format rate: the same on every run) with
its speeds kept apart (they differ on every run, so they belong in MLflow, not in a file under DVC). A study's
stages (vlmgym.compare.study) answer with `greedy_answers` and choose their constant with `choose_constant`, so an arm
answers as the rollout stage's policies do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

from vlmgym import envs
from vlmgym.eval import blind
from vlmgym.eval.records import write_jsonl
from vlmgym.eval.rollouts import answer_split, load_engine
from vlmgym.params import EnvParams, ModelParams, RolloutParams


@dataclass(frozen=True)
class Part:
    """One env answered on its own: the configured env (name "") or one part of an env made of several (its name)."""

    name: str
    env_params: EnvParams
    shards_dir: str


@dataclass(frozen=True)
class Answered:
    """What one policy (or baseline) scored on one env: `figures` for summary.json, `speed` for MLflow only;
    `ood` names the out-of-distribution split it answered too ("" when none)."""

    part: str
    policy: str
    figures: dict[str, Any]
    speed: dict[str, float]
    ood: str

    @property
    def name(self) -> str:
        """The policy as a path under the rollouts folder: <part>/<policy> for an env made of several, else <policy>."""
        return f"{self.part}/{self.policy}" if self.part else self.policy

    def metrics(self) -> dict[str, float]:
        """The numeric figures and speeds as MLflow metrics, each named <name>/<figure>."""
        numbers = {k: v for k, v in {**self.figures, **self.speed}.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)}
        return {f"{self.name}/{k}": v for k, v in numbers.items()}

    def line(self) -> str:
        """One printed line: samples, mean reward, format rate, speed and the out-of-distribution mean reward."""
        figures, speed = self.figures, self.speed
        return (f"rollout: {self.name}: {figures['samples']} samples, mean reward {figures['mean_reward']:.4f}, "
                f"format ok {figures['format_ok_rate']:.1%}"
                + (f", {speed['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in speed else "")
                + (f"; {self.ood}: mean reward {figures[f'{self.ood}_mean_reward']:.4f}" if self.ood else ""))


def env_parts(env_params: EnvParams, shards_dir: str) -> list[Part]:
    """The envs answered: the configured env over `shards_dir`, or each part of an env made of several over its own
    <shards_dir>/<name>/."""
    if not envs.has_parts(env_params):
        return [Part("", env_params, shards_dir)]
    return [Part(name, envs.part_params(env_params, name), f"{shards_dir}/{name}") for name in envs.parts(env_params)]


def open_engine(model_dir: str | Path, rollout: RolloutParams, model: ModelParams) -> tuple[Any, Any]:
    """(greedy RolloutEngine, params) of a JAX model folder with the rollout's answer budget and the model's dtypes."""
    return load_engine(model_dir, max_new_tokens=rollout.max_new_tokens, dtype=model.dtype,
                       param_dtype=model.param_dtype)


def open_env(env_params: EnvParams, rollout: RolloutParams, shards_dir: str, split: str, tokenizer: Any,
             limit: int | None) -> Any:
    """The env over the first `limit` samples of a split (None or 0: all), scored at `rollout.progress`."""
    return envs.from_params(env_params, shards_dir=shards_dir, split=split, tokenizer=tokenizer, limit=limit,
                            progress=rollout.progress)


def split_envs(rollout: RolloutParams, part: Part, tokenizer: Any) -> dict[str, Any]:
    """{split: env} of the splits a policy answers: `rollout.split`, then `rollout.ood_split` when the shards
    hold it."""
    opened = {rollout.split: open_env(part.env_params, rollout, part.shards_dir, rollout.split, tokenizer,
                                      rollout.limit)}
    if not rollout.ood_split:
        return opened
    if not (Path(part.shards_dir) / rollout.ood_split).is_dir():
        print(f"rollout: {part.shards_dir} holds no {rollout.ood_split} split (the env's generator wrote none, or "
              "data.ood_images is 0): in-distribution answers only")
        return opened
    opened[rollout.ood_split] = open_env(part.env_params, rollout, part.shards_dir, rollout.ood_split, tokenizer,
                                         rollout.limit)
    return opened


def answers_path(out: Path, rollout: RolloutParams, split: str, policy: str) -> Path:
    """Where a policy's answers to a split go: <out>/<policy>.jsonl for `rollout.split`, else under <out>/<split>/."""
    return (out if split == rollout.split else out / split) / f"{policy}.jsonl"


def reward_figures(records: list[dict]) -> dict[str, float]:
    return {"mean_reward": float(np.mean([r["reward"] for r in records])),
            "format_ok_rate": float(np.mean([r["format_ok"] for r in records]))}


def ood_split(rollout: RolloutParams, opened: dict[str, Any]) -> str:
    """The out-of-distribution split among the opened ones ("" when the shards hold none)."""
    return rollout.ood_split if rollout.ood_split and rollout.ood_split in opened else ""


def answer_greedy(rollout: RolloutParams, engine: Any, params: Any, opened: dict[str, Any], policy: str, out: Path,
                  blank_images: bool = False) -> tuple[dict[str, Any], dict[str, float]]:
    """Greedy answers of `policy` to every opened split, written under `out`: (figures, speeds)."""
    figures: dict[str, Any] = {}
    speed: dict[str, float] = {}
    for split, env in opened.items():
        records, timing = answer_split(engine, params, env, policy=policy, batch_size=rollout.batch_size,
                                       blank_images=blank_images)
        write_jsonl(answers_path(out, rollout, split, policy), records)
        if split == rollout.split:
            figures.update({**timing.counts(), **reward_figures(records)})
            speed.update(timing.speed())
        else:
            figures[f"{split}_mean_reward"] = float(np.mean([r["reward"] for r in records]))
            figures[f"{split}_samples"] = timing.samples
            speed[f"{split}_tokens_per_s"] = timing.tokens_per_s
    return figures, speed


def sampling_engine(engine: Any, rollout: RolloutParams) -> Any:
    """The engine sampling with `rollout.sampling` instead of answering greedily."""
    from vlmgym.rollout import RolloutEngine

    sampling = rollout.sampling
    return RolloutEngine(engine.cfg, engine.processor, replace(engine.settings, greedy=False,
                                                               temperature=sampling.temperature,
                                                               top_k=sampling.top_k, top_p=sampling.top_p))


def answer_sampled(rollout: RolloutParams, engine: Any, params: Any, env: Any, policy: str, number: int,
                   out: Path) -> tuple[dict[str, Any], dict[str, float]]:
    """`rollout.sampled_answers` sampled answers per prompt of the policy numbered `number` (its place in
    rollout.policies, which seeds them), as <out>/<policy>.sampled.jsonl: (figures, speeds)."""
    key = jax.random.fold_in(jax.random.key(rollout.seed), number)
    records, timing = answer_split(sampling_engine(engine, rollout), params, env, policy=policy,
                                   batch_size=rollout.batch_size, group_size=rollout.sampled_answers, key=key)
    write_jsonl(out / f"{policy}.sampled.jsonl", records)
    return ({"sampled_mean_reward": float(np.mean([r["reward"] for r in records]))},
            {"sampled_tokens_per_s": timing.tokens_per_s})


def answer_policy(rollout: RolloutParams, engine: Any, params: Any, part: Part, opened: dict[str, Any], policy: str,
                  number: int, out: Path) -> list[Answered]:
    """One policy's answers to one env's splits written under `out`: greedy and sampled, then with blanked images
    when it is one of `rollout.blind_policies`."""
    figures, speed = answer_greedy(rollout, engine, params, opened, policy, out)
    if rollout.sampled_answers > 0:
        sampled_figures, sampled_speed = answer_sampled(rollout, engine, params, opened[rollout.split], policy,
                                                        number, out)
        figures.update(sampled_figures)
        speed.update(sampled_speed)
    ood = ood_split(rollout, opened)
    answered = [Answered(part.name, policy, figures, speed, ood)]
    if policy in rollout.blind_policies:
        name = blind.blind_name(policy)
        blind_figures, blind_speed = answer_greedy(rollout, engine, params, opened, name, out, blank_images=True)
        answered.append(Answered(part.name, name, blind_figures, blind_speed, ood))
    return answered


def choose_constant(rollout: RolloutParams, env_params: EnvParams, shards_dir: str,
                    tokenizer: Any) -> tuple[str, float, str, int] | None:
    """(answer, mean reward, split chosen on, candidates tried) of the constant baseline (vlmgym.eval.blind): chosen
    on the val split, or on train's first samples without one; None when the env has no ideal answer to propose."""

    def opener(split: str, limit: int | None) -> Any:
        return open_env(env_params, rollout, shards_dir, split, tokenizer, limit)

    return blind.choose_constant(opener, shards_dir, rollout.constant_candidates)


def answer_constant(rollout: RolloutParams, part: Part, opened: dict[str, Any], out: Path) -> Answered | None:
    """The constant baseline's answers to every opened split, written under `out` as the policy `constant`; None
    (with a note) when the env has no ideal answer to propose."""
    env = opened[rollout.split]
    chosen = choose_constant(rollout, part.env_params, part.shards_dir, env.tokenizer)
    if chosen is None:
        print(f"rollout: {env.name} has no ideal answer to propose as a constant: no constant baseline")
        return None
    answer, chosen_reward, split, candidates = chosen
    figures: dict[str, Any] = {"answer": answer, "candidates": candidates, "chosen_on": split,
                               f"{split}_mean_reward": chosen_reward}
    for answered_split, split_env in opened.items():
        records = blind.constant_records(split_env, answer)
        write_jsonl(answers_path(out, rollout, answered_split, blind.CONSTANT), records)
        if answered_split == rollout.split:
            figures.update({"samples": len(records), **reward_figures(records)})
        else:
            figures[f"{answered_split}_mean_reward"] = float(np.mean([r["reward"] for r in records]))
    print(f"rollout: {part.name or env.name}: constant answer {answer!r} (best of {candidates} on {split})")
    return Answered(part.name, blind.CONSTANT, figures, {}, ood_split(rollout, opened))


def answer_policies(rollout: RolloutParams, model: ModelParams, env_params: EnvParams, out: Path,
                    on_answered: Callable[[Answered], None] | None = None) -> dict[str, dict]:
    """Every policy's and baseline's answers (module docstring) written under `out`, each `Answered` printed and
    passed to `on_answered` as it is done; returns the summary: {policy: figures}, or {sub-env: {policy: figures}}
    for an env made of several."""
    parts = env_parts(env_params, rollout.shards_dir)
    opened: dict[str, dict[str, Any]] = {}
    summary: dict[str, dict] = {}

    def done(*answered: Answered | None) -> None:
        for each in filter(None, answered):
            summary.setdefault(each.part, {})[each.policy] = each.figures
            print(each.line())
            if on_answered is not None:
                on_answered(each)

    for number, policy in enumerate(rollout.policies):
        engine, params = open_engine(Path(rollout.models_dir) / policy, rollout, model)
        for part in parts:
            if part.name not in opened:  # one env for every policy: they share the tokenizer of the base model
                opened[part.name] = split_envs(rollout, part, engine.processor.tokenizer)
            done(*answer_policy(rollout, engine, params, part, opened[part.name], policy, number, out / part.name))
    if rollout.constant_baseline:
        done(*(answer_constant(rollout, part, opened[part.name], out / part.name) for part in parts))
    return summary.get("", summary)

def greedy_answers(model_dir: str | Path, rollout: RolloutParams, model: ModelParams, env_params: EnvParams,
                   split: str, policy: str, blank_images: bool = False) -> list[dict]:
    """Greedy answers of a model folder to a split of `rollout.shards_dir`, as the rollout stage writes them
    (`blank_images`: every image grey, the text-only baseline)."""
    engine, params = open_engine(model_dir, rollout, model)
    env = open_env(env_params, rollout, rollout.shards_dir, split, engine.processor.tokenizer, rollout.limit)
    return answer_split(engine, params, env, policy=policy, batch_size=rollout.batch_size,
                        blank_images=blank_images)[0]
