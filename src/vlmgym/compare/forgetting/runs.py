"""A forgetting study's runs read back: every run's mean rewards per skill and split, its sampled answers on the new
skill, its KL and its training summary, as plain numbers per seed for the report."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.compare.arms import SPLITS
from vlmgym.compare.forgetting.settings import BLIND, GENERALIST, NEW, OLD, SINGLE, ForgettingStudy


def mean_reward(path: Path) -> float:
    from vlmgym.eval.records import read_jsonl

    if not path.is_file():
        raise FileNotFoundError(f"{path}: no answers; run the study's stages first (dvc repro of its dvc.yaml)")
    records = read_jsonl(path)
    return float(np.mean([r["reward"] for r in records]))


def sampled(path: Path) -> dict[str, float]:
    """The sampled answers' mean reward and best-of-k reward (each prompt's best of its k, averaged)."""
    from vlmgym.eval.records import read_jsonl

    groups: dict[str, list[float]] = {}
    for record in read_jsonl(path):
        groups.setdefault(str(record["id"]), []).append(float(record["reward"]))
    return {"sampled_mean_reward": float(np.mean([r for g in groups.values() for r in g])),
            "best_of_k_reward": float(np.mean([max(g) for g in groups.values()])),
            "k": float(max(len(g) for g in groups.values()))}


def splits_of(folder: Path) -> dict[str, float]:
    """{split: mean reward} of the held-out splits a folder holds answers to."""
    return {split: mean_reward(folder / f"{split}.jsonl") for split in SPLITS if (folder / f"{split}.jsonl").is_file()}


@dataclass
class Run:
    """One trained policy of one seed: the generalist or a sweep point."""

    new: float  # greedy mean reward on the new skill's test split
    new_sampled: dict[str, float]
    old: dict[str, dict[str, float]]  # part -> split -> mean reward
    kl: dict[str, Any]
    training: dict[str, Any]


@dataclass
class Seed:
    generalist: Run
    points: dict[str, Run]
    single: dict[str, dict[str, float]]  # part -> split -> mean reward of its single-task SFT
    blind: dict[str, dict[str, float]]  # part -> split -> the generalist with blank images
    single_training: dict[str, dict[str, Any]] = field(default_factory=dict)


def read_run(folder: Path, parts: list[str]) -> Run:
    return Run(new=mean_reward(folder / NEW / "test.jsonl"), new_sampled=sampled(folder / NEW / "test.sampled.jsonl"),
               old={part: splits_of(folder / OLD / part) for part in parts},
               kl=json.loads((folder / "kl.json").read_text()),
               training=json.loads((folder / "training.json").read_text()))


def read_seed(study: ForgettingStudy, seed: int, parts: list[str]) -> Seed:
    folder = study.run_folder(seed)
    return Seed(generalist=read_run(folder / GENERALIST, parts),
                points={point: read_run(folder / point, parts) for point in study.points},
                single={part: splits_of(folder / SINGLE / part) for part in parts},
                blind={part: splits_of(folder / GENERALIST / BLIND / part) for part in parts},
                single_training={part: json.loads((folder / SINGLE / part / "training.json").read_text())
                                 for part in parts})


def constants(study: ForgettingStudy, parts: list[str]) -> dict[str, dict[str, Any]]:
    """{part or "new": {"answer": ..., split: mean reward}} of the constant baseline (no splits where the env
    proposes no constant answer)."""
    out = {}
    for where in (*parts, NEW):
        folder = study.folder / "runs" / "constant" / where
        out[where] = {"answer": json.loads((folder / "constant.json").read_text())["answer"], **splits_of(folder)}
    return out
