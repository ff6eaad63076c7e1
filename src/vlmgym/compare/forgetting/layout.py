"""`vlmgym study new NAME --new-skill ENV`: a forgetting study's folder, its settings (params.yaml), its own pipeline
params (pipeline.yaml: the base params switched to the generalist's env, its data and base model under the study's
folder, vlmgym.compare.own_data) and the DVC pipeline that runs it (dvc.yaml):

    download, shard, base_model, convert   the pipeline's first stages on pipeline.yaml
    generalist@S                           -> runs/S/generalist/
    single@S                               -> runs/S/single/
    point@S-P                              -> runs/S/P/
    constant                               -> runs/constant/
    report                                 -> report.md, report.json, report.png (git-tracked: cache false)

(vlmgym.compare.forgetting.stages says what each does.) Each depends on the shards, the base model, the vlmgym
sources it runs and the params it reads, so `dvc repro` reruns exactly what a change touches.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from vlmgym.compare import own_data
from vlmgym.compare.arms import CONTROL
from vlmgym.compare.forgetting.settings import GENERALIST, SINGLE, ForgettingStudy, check, from_raw
from vlmgym.compare.layout import DVC_HEADER, HEADER, stage_writer
from vlmgym.compare.settings import PARAMS, STUDIES


def sweep(steps: Mapping[str, Sequence[int]], lrs: Mapping[str, Sequence[float]]) -> dict[str, dict[str, Any]]:
    """The points of a sweep: for each method, every number of steps at every learning rate (none given: the
    section's own), named <method>_<steps> (and _lr<k>, the k-th rate, when there are several)."""
    points: dict[str, dict[str, Any]] = {}
    for method, counts in steps.items():
        rates = list(lrs.get(method) or [None])
        for count in counts:
            for k, rate in enumerate(rates, start=1):
                name = f"{method}_{count}" + (f"_lr{k}" if len(rates) > 1 else "")
                points[name] = {"method": method, "steps": int(count),
                                **({"optimizer": {"lr": float(rate)}} if rate is not None else {})}
    return points


def dvc_stages(study: ForgettingStudy, sections: dict[str, Any]) -> dict[str, Any]:
    """The stages of the study's dvc.yaml (paths from the repository root, the stages' wdir)."""
    folder, base, own = study.folder.as_posix(), study.base_params.as_posix(), study.params_file.as_posix()
    data, base_model = sections["rollout"].shards_dir, sections["sft"].init_dir
    run = f"{folder}/runs/${{item.seed}}"
    by_seed = {"seed": "${study.seeds}"}
    stage, head = stage_writer(study)
    answering = ["model", "env", "rollout"]
    return {
        **head,
        GENERALIST: stage(f"{GENERALIST} {folder} --seed ${{item.seed}}", [base_model, data],
                          [{base: [CONTROL, *answering]}, {own: ["study.env", GENERALIST, "new_skill"]}],
                          [f"{run}/{GENERALIST}"], by_seed),
        SINGLE: stage(f"{SINGLE} {folder} --seed ${{item.seed}}", [base_model, data],
                      [{base: [CONTROL, *answering]}, {own: ["study.env", GENERALIST]}], [f"{run}/{SINGLE}"],
                      by_seed),
        "point": stage(f"point {folder} --seed ${{item.seed}} --point ${{item.point}}", [data, f"{run}/{GENERALIST}"],
                       [{base: [CONTROL, "train", *answering]},
                        {own: ["study.env", "study.select", "new_skill", "point.${item.point}"]}],
                       [f"{run}/${{item.point}}"], {**by_seed, "point": "${study.points}"}),
        "constant": stage(f"constant {folder}", [base_model, data], [{base: ["env", "rollout"]}, {own: ["new_skill"]}],
                          [f"{folder}/runs/constant"]),
        "report": stage(f"report {folder}", [f"{folder}/runs"],
                        [{base: ["eval", "env", "data", "rollout"]},
                         {own: ["study", GENERALIST, "new_skill", "point"]}],
                        [{f"{folder}/report.{kind}": {"cache": False}} for kind in ("md", "json", "png")]),
    }


def new_forgetting_study(name: str, *, base_params: str, env: str | None, new_skill: str,
                         new_skill_settings: Mapping[str, Any], seeds: Sequence[int], select: str,
                         points: Mapping[str, Mapping[str, Any]], generalist: Mapping[str, Any] | None = None,
                         rewrite: bool = False) -> ForgettingStudy:
    """Write studies/<name>/params.yaml, pipeline.yaml and dvc.yaml (from the repository root) and return the
    study. `env`: the generalist's env (default: the base params' env.name), one made of several envs; pipeline.yaml
    is the base params switched to it with its recipe, its data and base model under the study's folder. An
    existing study is refused unless `rewrite` (its settings are its pre-registration)."""
    from vlmgym.params import load_section
    from vlmgym.runtime.atomic import write_text_atomically
    from vlmgym.runtime.errors import UserError

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise UserError(f"vlmgym study new {name!r}: a study's name is a folder name (letters, numbers, _ . -)")
    if not Path(".dvc").is_dir():
        raise UserError("vlmgym study new: run it from the repository root (the folder holding .dvc/)")
    folder = STUDIES / name
    if (folder / PARAMS).exists() and not rewrite:
        raise UserError(f"{folder} exists: its settings are fixed (pre-registered); edit {folder / PARAMS} to change "
                        "them, or pick another name")
    env = env or load_section("env", base_params).name
    pipeline = folder / own_data.PIPELINE
    if not (rewrite and pipeline.is_file()):  # a rewrite keeps the pipeline.yaml the study's runs were set up with
        pipeline = own_data.write_pipeline(folder, base_params, env)
    raw = {"study": {"base_params": os.path.relpath(pipeline, folder), "env": env, "seeds": list(seeds),
                     "select": select, "points": list(points)},
           "generalist": dict(generalist or {}),
           "new_skill": {"env": new_skill, "settings": dict(new_skill_settings)},
           "point": {point: dict(settings) for point, settings in points.items()}}
    check(raw, folder / PARAMS)
    study = from_raw(raw, folder)
    sections = study.sections()
    study.generalist_settings()
    study.new_sections(sections)
    for point in study.points:
        study.settings_of(point)
    write_text_atomically(folder / PARAMS, HEADER.format(name=name, folder=folder) + yaml.safe_dump(
        raw, sort_keys=False, default_flow_style=None, width=120))
    write_dvc(study, sections)
    return study


def write_dvc(study: ForgettingStudy, sections: dict[str, Any]) -> None:
    from vlmgym.runtime.atomic import write_text_atomically

    stages = {"stages": dvc_stages(study, sections)}
    write_text_atomically(study.folder / "dvc.yaml", DVC_HEADER.format(name=study.name, folder=study.folder)
                          + yaml.safe_dump(stages, sort_keys=False, width=120))
