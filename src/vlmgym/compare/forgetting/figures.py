"""A forgetting study's results as numbers (report.json's body), from its runs read back (...forgetting.runs)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from vlmgym.compare.arms import CONTROL, SPLITS
from vlmgym.compare.forgetting import curves, kl
from vlmgym.compare.forgetting.runs import Run, Seed
from vlmgym.compare.forgetting.settings import ForgettingStudy


def change(run: Run, generalist: Run, split: str, parts: Sequence[str] | None = None) -> float:
    """The run's mean reward minus the generalist's on `split`, averaged over the old skills (`parts`: those
    only) that have that split; nan when none has it."""
    diffs = [run.old[p][split] - generalist.old[p][split] for p in (parts or run.old) if split in run.old[p]]
    return float(np.mean(diffs)) if diffs else math.nan


def old_splits(seeds: Sequence[Seed]) -> list[str]:
    """The held-out splits of the old skills: test, and test_ood where some old skill has one."""
    first = seeds[0].generalist.old
    return [split for split in SPLITS if any(split in by_split for by_split in first.values())]


def generalist_figures(seeds: Sequence[Seed], parts: Sequence[str], constants: dict[str, dict[str, Any]],
                       confidence: float) -> dict[str, Any]:
    """Per old skill and split: the generalist, its single-task SFT, its blind self and the constant, with the
    paired differences; on the new skill: greedy, sampled mean and best-of-k reward."""
    iv = curves.interval
    old: dict[str, Any] = {}
    for part in parts:
        old[part] = {}
        for split in seeds[0].generalist.old[part]:
            general = [s.generalist.old[part][split] for s in seeds]
            single = [s.single[part][split] for s in seeds]
            blind = [s.blind[part][split] for s in seeds]
            old[part][split] = {
                "generalist": iv(general, confidence), "single": iv(single, confidence),
                "blind": iv(blind, confidence), "constant": constants[part].get(split),
                "generalist_minus_single": iv([g - o for g, o in zip(general, single)], confidence),
                "generalist_minus_blind": iv([g - b for g, b in zip(general, blind)], confidence)}
    new = {"greedy": iv([s.generalist.new for s in seeds], confidence),
           **{key: iv([s.generalist.new_sampled[key] for s in seeds], confidence)
              for key in ("sampled_mean_reward", "best_of_k_reward")},
           "k": seeds[0].generalist.new_sampled["k"], "constant": constants["new"].get("test")}
    return {"old": old, "new": new, "val": plateau(seeds, parts)}


def plateau(seeds: Sequence[Seed], parts: Sequence[str]) -> dict[str, list[list[float]]]:
    """Each old skill's greedy val reward at the generalist's validations, the mean over seeds (the seeds validate
    at the same steps): whether it had levelled off where training ended."""
    out = {}
    for part in parts:
        key = f"env/{part}/val/reward_greedy"
        histories = [s.generalist.training.get("val", {}).get(key, []) for s in seeds]
        if histories and all(histories):
            steps = min(len(h) for h in histories)  # an early-stopped seed validated fewer times
            out[part] = [[histories[0][i][0], float(np.mean([h[i][1] for h in histories]))] for i in range(steps)]
    return out


def point_figures(study: ForgettingStudy, seeds: Sequence[Seed], splits: Sequence[str],
                  confidence: float) -> dict[str, Any]:
    """Per sweep point: its gain on the new skill, its change on the old skills (per split, and per skill), its
    KL to the generalist both ways, each with its t-interval over seeds."""
    iv = curves.interval
    out = {}
    for point in study.points:
        runs = [(s.points[point], s.generalist) for s in seeds]
        parts = list(seeds[0].generalist.old)
        out[point] = {
            "method": study.method(point),
            "settings": {k: v for k, v in study.point_settings[point].items() if k != "method"},
            "new": iv([r.new for r, _ in runs], confidence),
            "best_of_k_reward": iv([r.new_sampled["best_of_k_reward"] for r, _ in runs], confidence),
            "gain": iv([r.new - g.new for r, g in runs], confidence),
            "change": {split: iv([change(r, g, split) for r, g in runs], confidence) for split in splits},
            "change_per_skill": {part: {split: iv([change(r, g, split, [part]) for r, g in runs], confidence)
                                        for split in splits if split in seeds[0].generalist.old[part]}
                                 for part in parts},
            "kl": {d: iv([r.kl[d] for r, _ in runs], confidence) for d in kl.DIRECTIONS},
            "steps": [r.training["steps"] for r, _ in runs],
            "selected_step": [r.training.get("selected_step") for r, _ in runs]}
    return out


def method_curves(study: ForgettingStudy, seeds: Sequence[Seed], split: str) -> dict[str, list[curves.Curve]]:
    """Per method, each seed's curve: the generalist (0, 0), then each of the method's points (gain, change)."""
    methods = list(dict.fromkeys(study.method(p) for p in study.points))
    return {method: [[(0.0, 0.0)] + [(s.points[p].new - s.generalist.new, change(s.points[p], s.generalist, split))
                                     for p in study.points if study.method(p) == method] for s in seeds]
            for method in methods}


def results(study: ForgettingStudy, seeds: Sequence[Seed], parts: Sequence[str],
            constants: dict[str, dict[str, Any]], confidence: float) -> dict[str, Any]:
    """report.json's figures (docs/forgetting.md says what each means)."""
    splits = old_splits(seeds)
    matched, predicts = {}, {}
    for split in splits:
        by_method = method_curves(study, seeds, split)
        control = CONTROL if CONTROL in by_method else next(iter(by_method))
        matched[split] = curves.at_matched_gain(by_method, control, confidence)
        forgetting = [[-change(s.points[p], s.generalist, split) for p in study.points] for s in seeds]
        predicts[split] = {d: curves.kl_predicts([[s.points[p].kl[d] for p in study.points] for s in seeds],
                                                 forgetting, confidence) for d in kl.DIRECTIONS}
    return {"generalist": generalist_figures(seeds, parts, constants, confidence),
            "points": point_figures(study, seeds, splits, confidence), "splits": splits,
            "matched": matched, "kl_predicts_forgetting": predicts,
            "generalist_kl": {d: [s.generalist.kl[d] for s in seeds] for d in kl.DIRECTIONS}}
