"""Seeds as an axis of `vlmgym compare`: what one seed trains from, and the results over seeds.

Seed s trains its own SFT start (the sft section with seed s, its perception warm-up's too, from the base model
`sft.init_dir`) and every arm
from it with `train.seed` = s; the figures are means over seeds with two-level bootstrap intervals
(vlmgym.eval.seed_bootstrap), so run-to-run variance is in them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from vlmgym.envs.base import Env
from vlmgym.params import SFTParams, TrainParams

CONTROL = "sft"  # the arm every other is compared with: each seed's SFT start
HEADLINE = "mean_reward"  # the figure the tables lead with


def seed_numbers(count: int, first: int = 0) -> list[int]:
    """The seeds of `--seeds count --first-seed first`: first..first+count-1; none for one seed (the configured
    seeds and the pipeline's own SFT model)."""
    return list(range(first, first + count)) if count > 1 else []


def seeded(section: SFTParams | TrainParams, seed: int) -> SFTParams | TrainParams:
    """`section` with `seed`, and its adapters' seed too when it trains adapters (their init is random), and its
    perception warm-up's when SFT warms the vision tower up (its head's init and image order are random)."""
    changes: dict[str, Any] = {"seed": seed}
    if section.lora.rank:
        changes["lora"] = replace(section.lora, seed=seed)
    if isinstance(section, SFTParams) and section.perception.steps:
        changes["perception"] = replace(section.perception, seed=seed)
    return replace(section, **changes)


def seed_plan(sections: dict[str, Any], seed: int, folder: Path, checkpoints: Path) -> tuple[dict[str, Any], Any]:
    """Seed `seed`'s sections (train and sft seeded, train starting from this seed's SFT model) and the sft
    section that trains that start under `folder`/sft/model (None: no training, the start exists)."""
    train, sft = sections["train"], sections["sft"]
    sft_seed = seeded(sft, seed)
    start_config = None
    if train.init_dir == sft.out_dir and (sft.steps == 0 or sft_seed == sft):
        start = train.init_dir  # the pipeline's own SFT model, trained with exactly these settings
    elif sft.steps == 0:
        start = sft.init_dir  # a pass-through SFT is the base model, whatever the seed
    else:
        start_config = replace(sft_seed, out_dir=str(folder / CONTROL / "model"),
                               checkpointing=replace(sft_seed.checkpointing, dir=str(checkpoints / CONTROL)))
        start = start_config.out_dir
    return {**sections, "train": replace(seeded(train, seed), init_dir=start), "sft": sft_seed}, start_config


def seed_results(env: type[Env] | str, per_seed: Sequence[Mapping[str, Sequence[Mapping[str, Any]]]],
                 arms: Sequence[str], *, n_resamples: int, seed: int, confidence: float, baselines: Sequence[str] = (),
                 comparisons: Sequence[tuple[str, str]] = ()) -> dict[str, dict[str, float]]:
    """{policy: flat metrics} and {"<arm>_minus_sft": flat paired differences} over seeds (`per_seed`: one
    {policy: records} per seed, all on the same samples), for each of the image-blind `baselines` its metrics
    and "sft_minus_<baseline>", and "<a>_minus_<b>" for each further (a, b) of `comparisons` (arms of the same
    seed paired). With one seed these are exactly vlmgym.eval.metrics.evaluate_policies' figures; with more, each
    also holds `seeds` and every seed's `mean_reward_seed<k>`."""
    from vlmgym.eval.metrics import align_by_id, flatten_intervals, statistics_for
    from vlmgym.eval.seed_bootstrap import seed_bootstrap_intervals, seed_points

    options = {"n_resamples": n_resamples, "seed": seed, "confidence": confidence}

    def figures(records: list, statistics: list, control: list | None = None) -> dict[str, float]:
        flat = {"n": float(len(records[0])), **flatten_intervals(seed_bootstrap_intervals(statistics, control,
                                                                                           **options))}
        if len(statistics) > 1:
            points = seed_points(statistics, HEADLINE, control)
            flat.update({"seeds": float(len(points)), **{f"{HEADLINE}_seed{k}": v for k, v in enumerate(points)}})
        return flat

    out = {policy: figures([s[policy] for s in per_seed], [statistics_for(env, s[policy]) for s in per_seed])
           for policy in [CONTROL, *arms, *baselines]}
    for treatment, control in [(arm, CONTROL) for arm in arms] + [(CONTROL, b) for b in baselines] + list(comparisons):
        pairs = [align_by_id(s[treatment], s[control]) for s in per_seed]
        out[f"{treatment}_minus_{control}"] = figures([t for t, _ in pairs],
                                                      [statistics_for(env, t) for t, _ in pairs],
                                                      [statistics_for(env, c) for _, c in pairs])
    return out


def per_seed_table(results: Mapping[str, Mapping[str, float]], seeds: Sequence[int]) -> str:
    """Markdown: each policy's (and difference's) mean reward on every seed, and their mean, so the spread shows."""
    lines = ["| policy | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |", "|---|" + "---|" * (len(seeds) + 1)]
    for name, flat in results.items():
        sign = "+" if "_minus_" in name else ""
        values = [flat[f"{HEADLINE}_seed{k}"] for k in range(len(seeds))] + [flat[HEADLINE]]
        lines.append(f"| {name} | " + " | ".join(f"{v:{sign}.3f}" for v in values) + " |")
    return "\n".join(lines) + "\n"
