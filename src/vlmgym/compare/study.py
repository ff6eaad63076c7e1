"""`vlmgym study`: a comparative study (arms against their SFT start over seeds) as a DVC pipeline (docs/studies.md).

    vlmgym study new NAME [--params params.yaml] [--env E] [--seeds 5 6 7 8 9] [--arms sft_longer grpo ...]
                          [--select best_val|last]
    vlmgym study new NAME --env E --new-skill PART ...  a forgetting study (vlmgym.compare.forgetting.command)
    git add studies/NAME && git commit -m "study NAME: settings"   # pre-registration
    dvc repro studies/NAME/dvc.yaml                                   # runs it; again: only what is missing

The study's dvc.yaml runs the other subcommands, one DVC stage each, from the repository root:

    vlmgym study start studies/NAME --seed S           seed S's SFT start, and its answers
    vlmgym study arm studies/NAME --seed S --arm A     arm A from that start, and its answers
    vlmgym study blind studies/NAME --seed S           the start answering with blanked images
    vlmgym study constant studies/NAME                 the best constant answer
    vlmgym study report studies/NAME                   report.md, report.json, report.png

and, once reports are committed:

    vlmgym study tables [--check]                      the README's and docs' study tables from the reports
"""

from __future__ import annotations

import argparse

from vlmgym.compare.arms import ARMS


def new(argv: list[str]) -> int:
    from vlmgym.compare.forgetting import command as forgetting
    from vlmgym.compare.layout import DEFAULT_ARMS, DEFAULT_SEEDS, new_study

    parser = argparse.ArgumentParser(prog="vlmgym study new", description="write studies/NAME/params.yaml (the "
                                     "study's settings, to commit before it runs) and studies/NAME/dvc.yaml")
    parser.add_argument("name", help="the study's folder name under studies/")
    parser.add_argument("--params", default="params.yaml", help="the pipeline params the study builds on")
    parser.add_argument("--env", help="the env the study runs (default: the params' env.name, which must be it)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS),
                        help=f"training seeds, one SFT start each (default: {' '.join(map(str, DEFAULT_SEEDS))})")
    parser.add_argument("--arms", nargs="+",
                        help=f"arms trained from each start: {', '.join(ARMS)}, or a variant's name (give it "
                             f"settings in params.yaml's arm section) (default: {' '.join(DEFAULT_ARMS)})")
    parser.add_argument("--select", choices=("best_val", "last"),
                        help="validation.select of every arm (default: the params' train.validation.select; a "
                             "forgetting study's points: last)")
    forgetting.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.new_skill:
        if args.arms:
            parser.error("--arms: a forgetting study (--new-skill) trains the sweep's points, not arms")
        return forgetting.new(args)
    study = new_study(args.name, base_params=args.params, env=args.env, seeds=args.seeds,
                      arms=args.arms or list(DEFAULT_ARMS), select=args.select)
    print(f"{study.folder}/params.yaml and dvc.yaml written: {len(study.seeds)} seeds x arms {', '.join(study.arms)} "
          f"({study.env}, validation.select: {study.select}). Commit them (git add {study.folder}), then "
          f"`dvc repro {study.folder}/dvc.yaml`.")
    return 0


def _stage(argv: list[str], prog: str, seed: bool = False, arm: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"vlmgym study {prog}", description="a stage of a study's dvc.yaml")
    parser.add_argument("folder", help="the study's folder, studies/NAME")
    if seed:
        parser.add_argument("--seed", type=int, required=True)
    if arm:
        parser.add_argument("--arm", required=True)
    return parser.parse_args(argv)


def start(argv: list[str]) -> int:
    from vlmgym.compare import settings, stages
    from vlmgym.runtime.collector import collect_less

    collect_less()
    args = _stage(argv, "start", seed=True)
    stages.start(settings.load(args.folder), args.seed)
    return 0


def arm(argv: list[str]) -> int:
    from vlmgym.compare import settings, stages
    from vlmgym.runtime.collector import collect_less

    collect_less()
    args = _stage(argv, "arm", seed=True, arm=True)
    stages.arm(settings.load(args.folder), args.seed, args.arm)
    return 0


def blind(argv: list[str]) -> int:
    from vlmgym.compare import settings, stages

    args = _stage(argv, "blind", seed=True)
    stages.blind(settings.load(args.folder), args.seed)
    return 0


def _is_forgetting(folder: str) -> bool:
    from pathlib import Path

    from vlmgym.compare.forgetting.settings import is_forgetting
    from vlmgym.compare.settings import PARAMS
    from vlmgym.params import read_yaml

    path = Path(folder) / PARAMS
    return path.is_file() and is_forgetting(read_yaml(path))


def constant(argv: list[str]) -> int:
    from vlmgym.compare import settings, stages

    folder = _stage(argv, "constant").folder
    if _is_forgetting(folder):
        from vlmgym.compare.forgetting import settings as forgetting_settings
        from vlmgym.compare.forgetting import stages as forgetting_stages

        forgetting_stages.constant(forgetting_settings.load(folder))
    else:
        stages.constant(settings.load(folder))
    return 0


def report(argv: list[str]) -> int:
    from vlmgym.compare import settings
    from vlmgym.compare.report import report as write_report

    folder = _stage(argv, "report").folder
    if _is_forgetting(folder):
        from vlmgym.compare.forgetting import settings as forgetting_settings
        from vlmgym.compare.forgetting.report import report as forgetting_report

        forgetting_report(forgetting_settings.load(folder))
    else:
        write_report(settings.load(folder))
    return 0


def tables(argv: list[str]) -> int:
    from pathlib import Path

    from vlmgym.compare import readme

    parser = argparse.ArgumentParser(prog="vlmgym study tables", description="rewrite the study-table blocks of "
                                     "README.md and docs/ from the studies' report.json (vlmgym.compare.readme)")
    parser.add_argument("--check", action="store_true", help="only list the pages that differ; exit 1 if any")
    args = parser.parse_args(argv)
    root = Path(".")
    changed = readme.stale(root) if args.check else readme.rewrite(root)
    for page in changed:
        print(f"{page}: {'differs from' if args.check else 'rewritten from'} its studies' reports")
    if not changed:
        print("every study table agrees with its study's report")
    return 1 if args.check and changed else 0


COMMANDS = {
    "new": ("vlmgym.compare.study:new", "write a study's settings and DVC pipeline: studies/NAME/"),
    "start": ("vlmgym.compare.study:start", "stage: train seed S's SFT start and answer the held-out splits"),
    "arm": ("vlmgym.compare.study:arm", "stage: train arm A from seed S's start and answer"),
    "blind": ("vlmgym.compare.study:blind", "stage: seed S's start answering with its images blanked"),
    "generalist": ("vlmgym.compare.forgetting.command:generalist",
                   "stage of a forgetting study: train seed S's generalist on every old skill, and answer"),
    "single": ("vlmgym.compare.forgetting.command:single",
               "stage of a forgetting study: seed S's single-task SFT of each old skill, and its answers"),
    "point": ("vlmgym.compare.forgetting.command:point",
              "stage of a forgetting study: sweep point P from seed S's generalist, its answers and KL"),
    "constant": ("vlmgym.compare.study:constant", "stage: the best constant answer on every held-out split"),
    "report": ("vlmgym.compare.study:report", "stage: the study's report (report.md, .json, .png)"),
    "tables": ("vlmgym.compare.study:tables", "the README's and docs' study tables from the committed reports"),
}


def main(argv: list[str]) -> int:
    from vlmgym.cli import dispatch

    return dispatch("vlmgym study", COMMANDS, argv)
