"""`vlmgym study new`: a study's folder, its settings (params.yaml) and the DVC pipeline that runs it (dvc.yaml).

The pipeline's stages run from the repository root (`wdir`), as the top-level pipeline's do; DVC expands the matrix
stages over the settings' lists, one stage per seed (`start@5`, `blind@5`) and per (seed, arm) (`arm@5-grpo`):

    start@S     trains seed S's SFT start and answers the held-out splits  -> runs/S/sft/
    arm@S-A     trains arm A from that start and answers                    -> runs/S/A/
    blind@S     the start answering with its images blanked                 -> runs/S/sft_blind/
    constant    the best constant answer, chosen on val                     -> runs/constant/
    report      every run's answers -> report.md, report.json, report.png (git-tracked: cache false)

Each depends on the base pipeline's shards and base model, the vlmgym sources it runs and the params it reads, so
`dvc repro` reruns exactly what a change touches and the DVC cache holds every run.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from vlmgym.compare import own_data
from vlmgym.compare.settings import PARAMS, STUDIES, Study, check, from_raw

DEFAULT_SEEDS = (5, 6, 7, 8, 9)
DEFAULT_ARMS = ("sft_longer", "sft_compute", "grpo")
# The modules the stages' command starts from: the `vlmgym` dispatcher and the study's command.
ENTRY_MODULES = ("vlmgym.cli", "vlmgym.compare.study")
HEADER = """# Study {name}: its settings, fixed before it runs. Commit this file before `dvc repro {folder}/dvc.yaml`:
# git history then shows they came before the results. docs/studies.md says how to run, vary and read a study.
"""
DVC_HEADER = """# Study {name}'s pipeline, written by `vlmgym study new` from {folder}/params.yaml (seeds, arms,
# settings) and its base params. `dvc repro {folder}/dvc.yaml` runs what is missing or changed; docs/studies.md.
"""


def _module_file(src: Path, name: str) -> Path | None:
    base = src / Path(*name.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def _closure(src: Path) -> set[Path]:
    """Every vlmgym source file the stages can import (function-level imports too: a lazy import still runs)."""
    seen: set[Path] = set()
    todo = [p for p in (_module_file(src, m) for m in ENTRY_MODULES) if p]
    seen.update(todo)
    while todo:
        names: set[str] = set()
        for node in ast.walk(ast.parse(todo.pop().read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
        for name in (n for n in names if n.split(".")[0] == "vlmgym"):
            parts = name.split(".")
            for end in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                path = _module_file(src, ".".join(parts[:end]))
                if path is not None and path not in seen:
                    seen.add(path)
                    todo.append(path)
    return seen


def code_deps() -> list[str]:
    """The vlmgym sources the study's stages run, from the working directory (the repository root): each package
    they import from as a whole folder, so that no edit that could change a result leaves the study's runs
    standing (`dvc commit` accepts an edit that changes none); a package whose __init__ alone they import (the
    command dispatcher), and a top-level module, as its file. Empty when vlmgym is installed outside it."""
    import vlmgym

    package = Path(vlmgym.__file__).resolve().parent
    if not package.is_relative_to(Path.cwd().resolve()):
        return []
    files = _closure(package.parent)
    deps = set()
    for path in files:
        top = package / path.relative_to(package).parts[0]
        whole = top.is_dir() and any(f.parent != top or f.name != "__init__.py" for f in files if f.is_relative_to(top))
        deps.add(top if whole else path)
    return sorted(os.path.relpath(d) for d in deps)


def stage_writer(study: Any) -> tuple[Callable[..., dict], dict[str, Any]]:
    """(a function writing one stage of `study`'s dvc.yaml: `vlmgym study COMMAND`, run from the repository root, on
    the project's code and plug-in envs (an edit to one reruns what it changes) and its own deps, params and outs,
    over an optional matrix; the head stages of a study with its own data and base model, else none)."""
    code = [*code_deps(), *(["plugins"] if Path("plugins").is_dir() else [])]

    def stage(command: str, deps: list[str], params: list, outs: list, matrix: dict | None = None) -> dict:
        spec = {"matrix": dict(matrix)} if matrix else {}  # a copy each: yaml would write a shared one as an anchor
        return {**spec, "wdir": os.path.relpath(".", study.folder), "cmd": f"vlmgym study {command}",
                "deps": [*code, *deps], "params": params, "outs": outs}

    own = own_data.own_pipeline(study.base_params, study.folder)
    return stage, own_data.head_stages(study.base_params, code) if own else {}


def dvc_stages(study: Study, sections: dict[str, Any]) -> dict[str, Any]:
    """The stages of the study's dvc.yaml (paths from the repository root, the stages' wdir)."""
    folder, base, own = study.folder.as_posix(), study.base_params.as_posix(), study.params_file.as_posix()
    data = sorted({sections[s].shards_dir for s in ("sft", "train", "rollout")})
    base_model = sections["sft"].init_dir
    run = f"{folder}/runs/${{item.seed}}"
    by_seed = {"seed": "${study.seeds}"}
    stage, head = stage_writer(study)
    return {
        **head,
        "start": stage(f"start {folder} --seed ${{item.seed}}", [base_model, *data],
                       [{base: ["sft", "model", "env", "rollout"]}, {own: ["start"]}], [f"{run}/sft"], by_seed),
        "arm": stage(f"arm {folder} --seed ${{item.seed}} --arm ${{item.arm}}", [*data, f"{run}/sft"],
                     [{base: ["sft", "train", "model", "env", "rollout"]},
                      {own: ["study.env", "study.select", "arm.${item.arm}"]}],
                     [f"{run}/${{item.arm}}"], {**by_seed, "arm": "${study.arms}"}),
        "blind": stage(f"blind {folder} --seed ${{item.seed}}", [*data, f"{run}/sft"],
                       [{base: ["model", "env", "rollout"]}], [f"{run}/sft_blind"], by_seed),
        "constant": stage(f"constant {folder}", [base_model, *data], [{base: ["env", "rollout"]}],
                          [f"{folder}/runs/constant"]),
        "report": stage(f"report {folder}", [f"{folder}/runs"],
                        [{base: ["eval", "env", "data", "sft", "train"]}, {own: ["study", "arm", "start"]}],
                        [{f"{folder}/report.{kind}": {"cache": False}} for kind in ("md", "json", "png")]),
    }


def stage_paths(study: Study, stage: str, item: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """The deps and outs the study's dvc.yaml lists for `stage`, with a matrix stage's `item` filled in (for the
    lineage tags of its MLflow run)."""
    spec = yaml.safe_load((study.folder / "dvc.yaml").read_text())["stages"][stage]

    def filled(entries: list) -> list[str]:
        names = [e if isinstance(e, str) else next(iter(e)) for e in entries]
        return [re.sub(r"\$\{item\.(\w+)\}", lambda m: str((item or {})[m.group(1)]), n) for n in names]

    return {"deps": filled(spec["deps"]), "outs": filled(spec["outs"])}


def new_study(name: str, *, base_params: str = "params.yaml", env: str | None = None,
              seeds: tuple[int, ...] | list[int] = DEFAULT_SEEDS, arms: tuple[str, ...] | list[str] = DEFAULT_ARMS,
              select: str | None = None, settings: dict[str, dict[str, Any]] | None = None,
              start: dict[str, Any] | None = None, rewrite: bool = False) -> Study:
    """Write studies/<name>/params.yaml and dvc.yaml (from the repository root, the working directory) and return
    the study: `env` defaults to the base params' env.name (another env: the study gets its own pipeline.yaml and
    first stages, vlmgym.compare.own_data), `select` to their train.validation.select. An existing study is refused
    unless `rewrite` (its settings are its pre-registration)."""
    from vlmgym.params import load_section
    from vlmgym.runtime.atomic import write_text_atomically
    from vlmgym.runtime.errors import UserError

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise UserError(f"vlmgym study new {name!r}: a study's name is a folder name (letters, numbers, _ . -)")
    if not Path(".dvc").is_dir():
        raise UserError("vlmgym study new: run it from the repository root (the folder holding .dvc/): a study's "
                        f"stages depend on the pipeline's outputs, and its folder is {STUDIES}/<name>")
    folder = STUDIES / name
    if (folder / PARAMS).exists() and not rewrite:
        raise UserError(f"{folder} exists: its settings are fixed (pre-registered); edit {folder / PARAMS} to change "
                        "them, or pick another name")
    if env and env != load_section("env", base_params).name:  # another env: the study's own data and base model
        base_params = str(own_data.write_pipeline(folder, base_params, env))
    raw = {"study": {"base_params": os.path.relpath(base_params, folder),
                     "env": env or load_section("env", base_params).name, "seeds": list(seeds), "arms": list(arms),
                     "select": select or load_section("train", base_params).validation.select},
           "arm": {arm: dict((settings or {}).get(arm, {})) for arm in arms}, "start": dict(start or {})}
    check(raw, folder / PARAMS)
    study = from_raw(raw, folder)
    sections = study.sections()
    for arm in study.arms:
        study.arm_settings(arm)
    study.start_settings()
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomically(folder / PARAMS, HEADER.format(name=name, folder=folder) + yaml.safe_dump(
        study.raw(), sort_keys=False, default_flow_style=None, width=120))
    stages = {"stages": dvc_stages(study, sections)}
    write_text_atomically(folder / "dvc.yaml", DVC_HEADER.format(name=name, folder=folder) + yaml.safe_dump(
        stages, sort_keys=False, width=120))
    return study
