"""`vlmgym study new NAME --new-skill ENV ...`, a forgetting study (docs/forgetting.md), and its stages:

    vlmgym study generalist studies/NAME --seed S            seed S's generalist and its answers
    vlmgym study single studies/NAME --seed S                each old skill's single-task SFT, seed S
    vlmgym study point studies/NAME --seed S --point P       sweep point P from seed S's generalist
    vlmgym study constant studies/NAME / report studies/NAME  (the study command dispatches them here)
"""

from __future__ import annotations

import argparse
from typing import Any

import yaml

DEFAULT_SFT_STEPS = (50, 100, 200, 400)
DEFAULT_RL_STEPS = (25, 50, 100, 150)


def _setting(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE (the value read as YAML, e.g. tasks=[sum])")
    return key, yaml.safe_load(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `vlmgym study new` that make a forgetting study."""
    group = parser.add_argument_group("a forgetting study (--new-skill; docs/forgetting.md)")
    group.add_argument("--new-skill", metavar="ENV", help="make a forgetting study: the generalist trains on every "
                       "part of --env (an env made of several), then learns this part with the settings below")
    group.add_argument("--new-skill-setting", metavar="KEY=VALUE", type=_setting, action="append", default=[],
                       help="a setting of the new skill's env section (its data's other parts keep the base params')")
    group.add_argument("--rl", default="grpo", help="the RL method the sweep sets against SFT (default: grpo)")
    group.add_argument("--sft-steps", type=int, nargs="+", default=list(DEFAULT_SFT_STEPS),
                       help=f"SFT steps of the sweep's points (default: {' '.join(map(str, DEFAULT_SFT_STEPS))})")
    group.add_argument("--rl-steps", type=int, nargs="+", default=list(DEFAULT_RL_STEPS),
                       help=f"RL steps of the sweep's points (default: {' '.join(map(str, DEFAULT_RL_STEPS))})")
    group.add_argument("--sft-lr", type=float, nargs="+", help="SFT learning rates (every one at every step count; "
                       "default: the sft section's)")
    group.add_argument("--rl-lr", type=float, nargs="+", help="RL learning rates (default: the train section's)")
    group.add_argument("--generalist-steps", type=int, help="the generalist's SFT steps (default: the sft section's)")


def new(args: argparse.Namespace) -> int:
    from vlmgym.compare.arms import CONTROL
    from vlmgym.compare.forgetting.layout import new_forgetting_study, sweep

    points = sweep({CONTROL: args.sft_steps, args.rl: args.rl_steps}, {CONTROL: args.sft_lr, args.rl: args.rl_lr})
    study = new_forgetting_study(
        args.name, base_params=args.params, env=args.env, new_skill=args.new_skill,
        new_skill_settings=dict(args.new_skill_setting), seeds=args.seeds, select=args.select or "last",
        points=points, generalist={"steps": args.generalist_steps} if args.generalist_steps else {})
    print(f"{study.folder}/params.yaml, pipeline.yaml and dvc.yaml written: {len(study.seeds)} seeds x points "
          f"{', '.join(study.points)}, the generalist on {study.env}, the new skill {study.new_skill}. Commit them "
          f"(git add {study.folder}), then `dvc repro {study.folder}/dvc.yaml`.")
    return 0


def _stage(argv: list[str], prog: str, point: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"vlmgym study {prog}", description="a stage of a forgetting study")
    parser.add_argument("folder", help="the study's folder, studies/NAME")
    parser.add_argument("--seed", type=int, required=True)
    if point:
        parser.add_argument("--point", required=True)
    return parser.parse_args(argv)


def generalist(argv: list[str]) -> int:
    from vlmgym.compare.forgetting import settings, stages
    from vlmgym.runtime.collector import collect_less

    collect_less()
    args = _stage(argv, "generalist")
    stages.generalist(settings.load(args.folder), args.seed)
    return 0


def single(argv: list[str]) -> int:
    from vlmgym.compare.forgetting import settings, stages
    from vlmgym.runtime.collector import collect_less

    collect_less()
    args = _stage(argv, "single")
    stages.single(settings.load(args.folder), args.seed)
    return 0


def point(argv: list[str]) -> int:
    from vlmgym.compare.forgetting import settings, stages
    from vlmgym.runtime.collector import collect_less

    collect_less()
    args = _stage(argv, "point", point=True)
    stages.point(settings.load(args.folder), args.seed, args.point)
    return 0
