"""A study's settings: studies/<name>/params.yaml, written by `vlmgym study new` and committed before the study runs
(its pre-registration), read by every stage of the study's dvc.yaml.

    study:
      base_params: ../../params.yaml  # the pipeline params the study builds on (data, model, sft, train, rollout,
                                      # eval), from the study's folder
      env: <name>                     # the env those params must train (their env.name)
      seeds: [5, 6, 7, 8, 9]          # one SFT start and one run of every arm per seed
      arms: [sft_longer, grpo]        # vlmgym.compare.arms
      select: best_val                # validation.select of every arm: one rule for sft_longer and the RL arms
    arm:                              # each arm's settings over the section it trains (sft_longer: sft, else train)
      sft_longer: {}
      grpo: {optimizer: {lr: 3.0e-5}}
    start: {steps: 1800}              # the seeds' SFT start: settings over the base params' sft section
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmgym.compare.arms import ARMS, CONTROL, RESERVED, RL_ARMS, SFT_CONTROLS, validated_settings
from vlmgym.params import ParamsError

STUDIES = Path("studies")  # where `vlmgym study new` puts a study, from the repository root
PARAMS = "params.yaml"
SELECT = ("last", "best_val")
SECTIONS = ("train", "sft", "model", "env", "rollout", "eval", "data", "tracking")


class StudyFolder:
    """Where a study's files are, from its `folder` (studies/<name>): a base of the studies' settings classes."""

    folder: Path

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def params_file(self) -> Path:
        return self.folder / PARAMS

    def run_folder(self, seed: int) -> Path:
        """Where seed `seed`'s runs write their models and answers."""
        return self.folder / "runs" / str(seed)

    def checkpoints(self, seed: int) -> Path:
        """Seed `seed`'s resumable checkpoints: not DVC outputs, which DVC deletes before it reruns a stage."""
        return Path("checkpoints") / STUDIES / self.name / str(seed)


def check_seeds(seeds: Any, where: Path) -> None:
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int and s >= 0 for s in seeds) \
            or len(set(seeds)) < len(seeds):
        raise ParamsError(f"{where}: study.seeds: expected a list of distinct seeds >= 0, got {seeds!r}")


def base_params_of(study: Mapping[str, Any], folder: Path) -> Path:
    """study.base_params (from the study's folder) from the repository root; it must exist."""
    base = Path(os.path.normpath(folder / study["base_params"]))
    if not base.is_file():
        raise ParamsError(f"{folder / PARAMS}: study.base_params {study['base_params']!r}: no such file ({base})")
    return base


def read_settings(folder: str | Path, check: Any, command: str) -> tuple[Any, Path]:
    """(the settings read from `folder`/params.yaml, checked by `check`, the folder normalised); `command` makes a
    study where there is none."""
    from vlmgym.params import read_yaml

    folder = Path(os.path.normpath(folder))
    path = folder / PARAMS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no study here; `{command}` makes one")
    raw = read_yaml(path)
    check(raw, path)
    return raw, folder


@dataclass(frozen=True)
class Study(StudyFolder):
    """A study's settings; paths from the repository root, where its stages run."""

    folder: Path
    base_params: Path
    env: str
    seeds: tuple[int, ...]
    arms: tuple[str, ...]
    select: str
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # arm -> its settings, as written
    start: Mapping[str, Any] = field(default_factory=dict)  # the start's settings over the sft section, as written

    def raw(self) -> dict[str, Any]:
        """The settings as params.yaml holds them."""
        return {"study": {"base_params": os.path.relpath(self.base_params, self.folder), "env": self.env,
                          "seeds": list(self.seeds), "arms": list(self.arms), "select": self.select},
                "arm": {arm: dict(self.settings.get(arm, {})) for arm in self.arms}, "start": dict(self.start)}

    def arm_settings(self, arm: str) -> dict[str, Any]:
        """An arm's settings as dotted keys, validated against the base params."""
        return validated_settings(arm, self.settings.get(arm, {}), self.base_params, f"{self.params_file}: arm.{arm}")

    def start_settings(self) -> dict[str, Any]:
        """The start's settings as dotted keys of the sft section, validated against the base params."""
        return validated_settings(CONTROL, self.start, self.base_params, f"{self.params_file}: start")

    def sections(self) -> dict[str, Any]:
        """The base params' sections, checked to train the study's env with every arm the study names."""
        from vlmgym.params import load_section

        sections = {name: load_section(name, self.base_params) for name in SECTIONS}
        trained = sections["env"].name
        if trained != self.env:
            raise ParamsError(f"{self.params_file}: study.env is {self.env!r} but {self.base_params} trains env.name "
                              f"{trained!r}: a study runs on its base pipeline's data and models; switch them back "
                              f"(vlmgym recipe {self.env}) or make a study for {trained!r}")
        if "ppo" in self.arms and getattr(sections["env"].settings(), "tools", ()):
            raise ParamsError(f"{self.params_file}: study.arms: env {trained!r} runs episodes with tools, which PPO "
                              "does not train (grpo, rloo and dpo do): leave ppo out")
        return sections


def check(raw: Any, where: Path) -> None:
    """One line naming the key when `raw` (a study's params file, read) is not a study's settings."""
    if not isinstance(raw, Mapping) or set(raw) - {"study", "arm", "start"} \
            or not isinstance(raw.get("study"), Mapping) or not isinstance(raw.get("arm") or {}, Mapping) \
            or not isinstance(raw.get("start") or {}, Mapping):
        raise ParamsError(f"{where}: expected the sections study, arm and start (vlmgym study new writes them)")
    study, arms = raw["study"], raw.get("arm") or {}
    unknown = set(study) - {"base_params", "env", "seeds", "arms", "select"}
    if unknown:
        raise ParamsError(f"{where}: study.{sorted(unknown)[0]}: unknown key (known: base_params, env, seeds, arms, "
                          "select)")
    names = study.get("arms")
    check_seeds(study.get("seeds"), where)
    if not isinstance(names, list) or not names or len(set(names)) < len(names) \
            or not all(isinstance(a, str) and a.isidentifier() for a in names):
        raise ParamsError(f"{where}: study.arms: expected a list of distinct arm names (words), got {names!r}")
    for name in names:
        if name in RESERVED:
            raise ParamsError(f"{where}: study.arms: {name!r} is not an arm: the study trains each seed's start "
                              f"({RESERVED[0]}) and answers the baselines ({', '.join(RESERVED[1:])}) itself")
        if not isinstance(arms.get(name), Mapping):
            raise ParamsError(f"{where}: arm.{name}: missing; every arm of study.arms needs its settings "
                              f"(`{name}: {{}}` for none)")
        if name not in ARMS and not arms[name]:
            raise ParamsError(f"{where}: arm.{name}: {name!r} is not one of {', '.join(ARMS)}, so it is a variant of "
                              "the train section and needs settings, e.g. "
                              "{objective: {importance_sampling_level: sequence}}")
    if study.get("select") not in SELECT:
        raise ParamsError(f"{where}: study.select: expected one of {', '.join(SELECT)}, got {study.get('select')!r}")
    for key in ("base_params", "env"):
        if not isinstance(study.get(key), str) or not study[key]:
            raise ParamsError(f"{where}: study.{key}: expected a string, got {study.get(key)!r}")


def from_raw(raw: Mapping[str, Any], folder: Path) -> Study:
    """A Study from checked settings (check) of the study in `folder`."""
    study = raw["study"]
    return Study(folder=folder, base_params=base_params_of(study, folder), env=study["env"],
                 seeds=tuple(study["seeds"]),
                 arms=tuple(study["arms"]), select=study["select"],
                 settings={name: dict(raw.get("arm", {}).get(name) or {}) for name in study["arms"]},
                 start=dict(raw.get("start") or {}))


def load(folder: str | Path) -> Study:
    """The study in `folder` (studies/<name>, from the repository root), its settings checked."""
    raw, folder = read_settings(folder, check, f"vlmgym study new {Path(folder).name}")
    return from_raw(raw, folder)


def comparisons(study: Study, sections: dict[str, Any]) -> list[tuple[str, str]]:
    """The pairs beyond `<arm> - sft`: every RL arm and variant against each SFT control that is an arm (sft_longer,
    sft_compute), and each variant against the arm of its algorithm (when that is an arm): what the knob changes."""
    rl = [arm for arm in study.arms if arm not in SFT_CONTROLS]
    pairs = [(arm, control) for arm in rl for control in SFT_CONTROLS if control in study.arms]
    for arm in rl:
        if arm not in RL_ARMS:
            base = study.settings[arm].get("algorithm", sections["train"].algorithm)
            base = "dpo" if base == "online_dpo" else base  # the arm's name for that algorithm
            if base in study.arms and base != arm:
                pairs.append((arm, base))
    return pairs
