"""vlmgym compare: training algorithms from one SFT start per seed at a matched budget, as a study written and run.

    vlmgym compare [--params params.yaml] [--arms sft_longer sft_compute grpo ppo dpo [rloo]]
                   [--variant NAME=KEY=VALUE[,...]] [--seeds N [--first-seed F]] [--select best_val|last]
                   [--name compare]

writes the study studies/<name>/ (`vlmgym study`, docs/studies.md: seeds F..F+N-1, the arms, each variant's settings;
a study of that name is rewritten) and runs `dvc repro studies/<name>/dvc.yaml`, then prints its report
(studies/<name>/report.md, beside report.json and report.png). DVC is the cache: a second call with the same
settings trains nothing, a changed arm retrains that arm alone, and a killed training resumes from its
checkpoints. Arms and variants are the study's (vlmgym.compare.arms): every arm starts from its seed's SFT start,
RL arms at train.steps x batch_prompts x group_size sampled completions, sft_longer on as many SFT sequences,
sft_compute for as many training FLOPs,
every arm selected on val by one rule (`--select`, default the params' train.validation.select).

`--variant NAME=KEY=VALUE[,KEY=VALUE...]` (repeatable) adds an arm NAME: the train section with those keys changed
(TRL's names accepted; a sub-section's key dotted, optimizer.lr=3e-5; values read as YAML and validated as
params.yaml's would be), reported against the arm of its train.algorithm: what the knob changes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from vlmgym.compare.arms import ARMS, RESERVED, validated_settings

DEFAULT_ARMS = ("sft_longer", "sft_compute", "grpo", "ppo", "dpo")  # rloo on request: GRPO with another baseline


def parse_variants(specs: list[str]) -> dict[str, dict[str, Any]]:
    """{name: {key: value}} from `NAME=KEY=VALUE[,KEY=VALUE...]` strings (values read as YAML; the study validates
    them against the params); a ValueError names the spec that is malformed."""
    import yaml

    variants: dict[str, dict[str, Any]] = {}
    for spec in specs:
        name, _, settings = spec.partition("=")
        if not name.isidentifier() or not settings:
            raise ValueError(f"--variant {spec!r}: expected NAME=KEY=VALUE[,KEY=VALUE...] with NAME a word, "
                             "e.g. gspo=objective.importance_sampling_level=sequence")
        if name in (*ARMS, *RESERVED) or name in variants:
            raise ValueError(f"--variant {spec!r}: the name {name!r} is taken (arms: {', '.join(ARMS)}; "
                             f"{', '.join(RESERVED)}; or an earlier variant)")
        raw: dict[str, Any] = {}
        for setting in settings.split(","):
            key, equals, value = setting.partition("=")
            if not equals or not key.strip():
                raise ValueError(f"--variant {spec!r}: {setting!r} is not KEY=VALUE")
            raw[key.strip()] = yaml.safe_load(value)
        variants[name] = raw
    return variants


def main(argv: list[str] | None = None) -> int:
    """Write the study, run it with DVC and print its report."""
    from vlmgym.compare.layout import new_study

    parser = argparse.ArgumentParser(prog="vlmgym compare", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (the pipeline's)")
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS,
                        help=f"arms besides sft (default: {' '.join(DEFAULT_ARMS)})")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,...]",
                        help="an arm NAME: the train section with KEY=VALUE changed (repeatable), e.g. "
                             "gspo=objective.importance_sampling_level=sequence")
    parser.add_argument("--seeds", type=int, default=1, help="training seeds F..F+N-1, each with its own SFT start "
                                                             "(default 1: intervals over test samples only)")
    parser.add_argument("--first-seed", type=int, default=0, metavar="F", help="the first seed (default 0)")
    parser.add_argument("--select", choices=("best_val", "last"),
                        help="validation.select of every arm (default: the params' train.validation.select)")
    parser.add_argument("--name", default="compare", help="the study's folder under studies/ (default: compare)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.first_seed < 0:
        parser.error(f"--seeds {args.seeds} --first-seed {args.first_seed}: needs N >= 1 seeds from F >= 0")
    try:
        variants = parse_variants(args.variant)
    except ValueError as err:
        parser.error(str(err))
    # written into the study as typed, canonical keys (TRL's names as vlmgym's, "3e-5" as a number)
    variants = {name: validated_settings(name, raw, args.params, f"--variant {name}") for name, raw in variants.items()}
    study = new_study(args.name, base_params=args.params, seeds=range(args.first_seed, args.first_seed + args.seeds),
                      arms=[*dict.fromkeys(args.arms), *variants], select=args.select, settings=variants,
                      rewrite=True)
    print(f"compare: {study.folder}: {len(study.seeds)} seed(s) x {', '.join(study.arms)}; "
          f"dvc repro {study.folder}/dvc.yaml", flush=True)
    # the stages call `vlmgym`: this interpreter's, installed beside it
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "dvc", "repro", str(study.folder / "dvc.yaml")], env=env)
    if done.returncode:
        print(f"compare: dvc repro {study.folder}/dvc.yaml failed ({done.returncode}); what finished is cached, and "
              "the same command continues from there", file=sys.stderr)
        return done.returncode
    print((study.folder / "report.md").read_text())
    return 0
