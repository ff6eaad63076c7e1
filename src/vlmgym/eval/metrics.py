"""Metrics over rollout records, for any env: each env's own metric arrays (Env.task_statistics) plus the shared
format-valid rate and mean reward, with bootstrap intervals and paired differences between policies.

A rollout record is one answer of one policy to one test sample (a JSON object, one per line of the rollout
JSONL; vlmgym.eval.records.rollout_record builds one from an env step). The shared fields:

    id                 sample id (string)
    policy, env        who answered, and the env's name
    answer             the model's answer text
    parsed, truth      what the env's parser read from the answer, and the sample's truth (env-specific)
    reward             the env's scalar reward
    reward_components  the env's named reward components (free-form)
    format_ok          whether the env's parser found a well-formed answer (a JSON boolean)

plus the env's own fields (Env.record_fields). `env` arguments below take an Env class or an env's name.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vlmgym.envs import env_class as by_name
from vlmgym.envs.base import Env
from vlmgym.eval.episodes import episode_statistics
from vlmgym.eval.sampled import sampled_statistics
from vlmgym.stats.bootstrap import Interval, Statistic, bootstrap_intervals, paired_bootstrap_intervals
from vlmgym.stats.fields import record_field, record_where


def env_class(env: type[Env] | str) -> type[Env]:
    """An Env class from a class or a name (registered, entry point or 'package.module:Class')."""
    return by_name(env) if isinstance(env, str) else env


def reward_value(record: Mapping[str, Any], where: str) -> float:
    value = record_field(record, "reward", where)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{where}: reward must be a finite number, got {value!r}")
    return float(value)


def format_valid(env: type[Env] | str, record: Mapping[str, Any]) -> bool:
    """The env's format_ok flag and a prediction the env's metrics can use."""
    flag = record.get("format_ok")
    # a stray "yes" string is not a flag
    return isinstance(flag, bool | np.bool_) and bool(flag) and env_class(env).usable_prediction(record)


def statistics_for(env: type[Env] | str, records: Sequence[Mapping[str, Any]], **options: Any) -> dict[str, Statistic]:
    """The metric arrays of env `env`: its own (Env.task_statistics with `options`), then the format-valid rate
    and the mean reward."""
    cls = env_class(env)
    if not records:
        raise ValueError(f"no {cls.name} records to evaluate")
    stats = dict(cls.task_statistics(records, **options))
    format_ok = np.array([format_valid(cls, r) for r in records], dtype=np.float64)
    rewards = np.array([reward_value(r, record_where(r, i)) for i, r in enumerate(records)], dtype=np.float64)
    stats["format_valid_rate"] = Statistic("mean", format_ok)
    stats["mean_reward"] = Statistic("mean", rewards)
    stats.update(sampled_statistics(records))
    stats.update(episode_statistics(records))
    return stats


def flatten_intervals(intervals: Mapping[str, Interval]) -> dict[str, float]:
    """{name: Interval} -> flat {name, name_ci_low, name_ci_high}."""
    flat: dict[str, float] = {}
    for name, interval in intervals.items():
        flat[name] = interval.estimate
        flat[f"{name}_ci_low"] = interval.low
        flat[f"{name}_ci_high"] = interval.high
    return flat


def evaluate(env: type[Env] | str, records: Sequence[Mapping[str, Any]], *, n_resamples: int = 1000, seed: int = 0,
             confidence: float = 0.95, **options: Any) -> dict[str, float]:
    """Flat metrics of one policy's records, each with its bootstrap interval, plus `n` (samples)."""
    intervals = bootstrap_intervals(statistics_for(env, records, **options), n_resamples=n_resamples,
                                    seed=seed, confidence=confidence)
    return {"n": float(len(records)), **flatten_intervals(intervals)}


def align_by_id(treatment: Sequence[Mapping[str, Any]],
                control: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Order both policies' records by sample id; they must cover exactly the same ids, once each."""
    by_id = []
    for name, records in (("treatment", treatment), ("control", control)):
        index: dict[str, Mapping[str, Any]] = {}
        for i, record in enumerate(records):
            sample_id = str(record_field(record, "id", record_where(record, i)))
            if sample_id in index:
                raise ValueError(f"{name} records: sample id {sample_id!r} appears twice (record {i})")
            index[sample_id] = record
        by_id.append(index)
    only_t, only_c = sorted(by_id[0].keys() - by_id[1].keys()), sorted(by_id[1].keys() - by_id[0].keys())
    if only_t or only_c:
        raise ValueError(f"a paired comparison needs the same samples: {len(only_t)} ids only in treatment "
                         f"{only_t[:5]}, {len(only_c)} only in control {only_c[:5]}")
    ids = sorted(by_id[0])
    return [by_id[0][i] for i in ids], [by_id[1][i] for i in ids]


def compare(env: type[Env] | str, treatment: Sequence[Mapping[str, Any]], control: Sequence[Mapping[str, Any]], *,
            n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95,
            **options: Any) -> dict[str, float]:
    """Flat treatment - control differences on the same samples, with paired bootstrap intervals."""
    treatment, control = align_by_id(treatment, control)
    intervals = paired_bootstrap_intervals(statistics_for(env, treatment, **options),
                                           statistics_for(env, control, **options),
                                           n_resamples=n_resamples, seed=seed, confidence=confidence)
    return {"n": float(len(treatment)), **flatten_intervals(intervals)}


def evaluate_policies(env: type[Env] | str, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], *,
                      comparisons: Sequence[tuple[str, str]] = (("grpo", "sft"),), n_resamples: int = 1000,
                      seed: int = 0, confidence: float = 0.95,
                      **options: Any) -> dict[str, dict[str, float]]:
    """{policy: flat metrics} plus {"<a>_minus_<b>": flat paired differences} for each comparison present."""
    out = {policy: evaluate(env, records, n_resamples=n_resamples, seed=seed, confidence=confidence,
                            **options)
           for policy, records in records_by_policy.items()}
    for treatment, control in comparisons:
        if treatment in records_by_policy and control in records_by_policy:
            out[f"{treatment}_minus_{control}"] = compare(
                env, records_by_policy[treatment], records_by_policy[control], n_resamples=n_resamples,
                seed=seed, confidence=confidence, **options)
    return out


# --- answer collapse ------------------------------------------------------------------------------------------
# A policy that gives (almost) one answer to every prompt has stopped looking at its input: a binary task then sits
# at chance while every metric still looks like a number. The check is on answer texts, so it works for any env.
# 0.95: a balanced binary task answered this one-sidedly is at most ~55% accurate, and an open-answer task (free text,
# coordinates) never repeats one answer on 95% of its samples unless it collapsed.
COLLAPSE_TOP_SHARE = 0.95


def answer_key(text: Any) -> str:
    """An answer as the collapse check compares it: whitespace runs folded to one space, case folded (so 'True',
    'true ' and 'TRUE' are one answer; '55.1, 37.6' and '55.2, 37.6' stay two)."""
    return " ".join(str(text if text is not None else "").split()).casefold()


def answer_spread(texts: Sequence[Any]) -> dict[str, Any]:
    """How varied a set of answers is: `distinct_share` (distinct answers / answers), `top_share` (the most frequent
    answer's share; ties go to the answer seen first) and `top_answer` (its normalised text)."""
    if not texts:
        raise ValueError("answer_spread needs at least one answer")
    counts: dict[str, int] = {}
    for text in texts:
        key = answer_key(text)
        counts[key] = counts.get(key, 0) + 1
    top_answer = max(counts, key=counts.__getitem__)  # max keeps the first of equal counts (insertion order)
    return {"distinct_share": len(counts) / len(texts), "top_share": counts[top_answer] / len(texts),
            "top_answer": top_answer}


def collapsed(spread: Mapping[str, Any], threshold: float = COLLAPSE_TOP_SHARE) -> bool:
    """Whether one answer covers at least `threshold` of all answers."""
    return spread["top_share"] >= threshold
