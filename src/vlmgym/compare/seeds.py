"""Seeds as a study's axis: what one seed trains from, and the results over seeds.

Seed s trains its own SFT start (the sft section with seed s, its adapters' and perception warm-up's too, from the
base model `sft.init_dir`) and every arm from it with `train.seed` = s. The figures are means over seeds; with
several seeds the interval is the t-interval over the seeds' own values (a difference: each seed's arm minus that
seed's control, vlmgym.eval.seed_bootstrap.seed_t_intervals), which keeps its coverage at 3 to 10 seeds, and the
two-level bootstrap (seeds, then samples) stands beside it as `<metric>_boot_low` / `_boot_high`. One seed has only
its sample bootstrap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from vlmgym.compare.arms import CONTROL
from vlmgym.envs.base import Env
from vlmgym.params import SFTParams, TrainParams, with_values

HEADLINE = "mean_reward"  # the figure the tables lead with


def seeded(section: SFTParams | TrainParams, seed: int) -> SFTParams | TrainParams:
    """`section` with `seed`, and its adapters' seed too when it trains adapters (their init is random), and its
    perception warm-up's when SFT warms the vision tower up (its head's init and image order are random)."""
    changes: dict[str, Any] = {"seed": seed}
    if section.lora.rank:
        changes["lora"] = replace(section.lora, seed=seed)
    if isinstance(section, SFTParams) and section.perception.steps:
        changes["perception"] = replace(section.perception, seed=seed)
    return replace(section, **changes)


def start_config(sections: dict[str, Any], seed: int, folder: Path, checkpoints: Path,
                 settings: Mapping[str, Any] | None = None) -> SFTParams:
    """The sft section, with the study's start `settings` (dotted keys), that trains seed `seed`'s start into
    `folder`/sft/model (checkpoints under `checkpoints`/sft)."""
    sft = seeded(with_values(sections["sft"], dict(settings or {})), seed)
    return replace(sft, out_dir=str(folder / CONTROL / "model"),
                   checkpointing=replace(sft.checkpointing, dir=str(checkpoints / CONTROL)))


def seed_sections(sections: dict[str, Any], seed: int, start: str) -> dict[str, Any]:
    """Seed `seed`'s sections: train and sft seeded, train starting from `start`, that seed's SFT model."""
    return {**sections, "train": replace(seeded(sections["train"], seed), init_dir=start),
            "sft": seeded(sections["sft"], seed)}


def seed_results(env: type[Env] | str, per_seed: Sequence[Mapping[str, Sequence[Mapping[str, Any]]]],
                 arms: Sequence[str], *, n_resamples: int, seed: int, confidence: float, baselines: Sequence[str] = (),
                 comparisons: Sequence[tuple[str, str]] = ()) -> dict[str, dict[str, float]]:
    """{policy: flat metrics} and {"<arm>_minus_sft": flat paired differences} over seeds (`per_seed`: one
    {policy: records} per seed, all on the same samples), for each of the image-blind `baselines` its metrics
    and "sft_minus_<baseline>", and "<a>_minus_<b>" for each further (a, b) of `comparisons` (arms of the same
    seed paired). With one seed these are exactly vlmgym.eval.metrics.evaluate_policies' figures; with more, each
    metric's `_ci_low` / `_ci_high` is its t-interval over seeds and `_boot_low` / `_boot_high` its two-level
    bootstrap interval, and each figure set holds `seeds` and every seed's `mean_reward_seed<k>`."""
    from vlmgym.eval.metrics import align_by_id, flatten_intervals, statistics_for
    from vlmgym.eval.seed_bootstrap import seed_bootstrap_intervals, seed_points, seed_t_intervals

    options = {"n_resamples": n_resamples, "seed": seed, "confidence": confidence}

    def figures(records: list, statistics: list, control: list | None = None) -> dict[str, float]:
        bootstrap = seed_bootstrap_intervals(statistics, control, **options)
        t = seed_t_intervals(statistics, control, confidence=confidence)  # {} for one seed
        flat = {"n": float(len(records[0])), **flatten_intervals(t or bootstrap)}
        if t:
            for name, interval in bootstrap.items():
                flat.update({f"{name}_boot_low": interval.low, f"{name}_boot_high": interval.high})
        if len(statistics) > 1:
            points = seed_points(statistics, HEADLINE, control)
            flat.update({"seeds": float(len(points)), **{f"{HEADLINE}_seed{k}": v for k, v in enumerate(points)}})
        return flat

    out = {policy: figures([s[policy] for s in per_seed], [statistics_for(env, s[policy]) for s in per_seed])
           for policy in [CONTROL, *arms, *baselines]}
    for treatment, control in [(arm, CONTROL) for arm in arms] + list(comparisons) + [(CONTROL, b) for b in baselines]:
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
        # one seed's value is the mean itself
        values = [flat.get(f"{HEADLINE}_seed{k}", flat[HEADLINE]) for k in range(len(seeds))] + [flat[HEADLINE]]
        lines.append(f"| {name.replace('_minus_', ' - ')} | " + " | ".join(f"{v:{sign}.3f}" for v in values) + " |")
    return "\n".join(lines) + "\n"
