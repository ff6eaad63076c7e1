"""A forgetting study's settings: studies/<name>/params.yaml, written by `vlmgym study new NAME --new-skill ENV` and
committed before the study runs (its pre-registration), read by every stage of its dvc.yaml.

    study:
      base_params: pipeline.yaml   # pipeline params whose env is made of several (env.name's parts: the old skills)
      env: <the several-env name>  # the env those params train the generalist on
      seeds: [5, 6, 7, 8, 9]       # one generalist per seed, and every sweep point trained from it
      select: last                 # validation.select of every sweep point
      points: [sft_50, grpo_50]    # the sweep, one stage per (seed, point)
    generalist: {steps: 3000}      # the generalist: settings over the base params' sft section
    new_skill:
      env: <a part of env>         # the skill taught: one of the parts' data, asked with its own settings
      settings: {<key>: <value>}   # env.<that part>'s settings for the new skill (the parts keep the base params')
    point:                         # each point: its method (sft, or an RL algorithm) and settings over its section
      sft_50: {method: sft, steps: 50}
      grpo_50: {method: grpo, steps: 50, optimizer: {lr: 3.0e-5}}
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlmgym.compare.arms import BUDGET_KEYS, CONTROL, RL_ARMS, arm_section, validated_settings
from vlmgym.compare.settings import SECTIONS, SELECT, StudyFolder, base_params_of, check_seeds, read_settings
from vlmgym.params import ParamsError

METHODS = (CONTROL, *RL_ARMS)  # how a point teaches the new skill: SFT on its ideal answers, or an RL algorithm
GENERALIST = "generalist"
SINGLE = "single"  # each old skill's single-task SFT, the generalist's reference
BLIND = "blind"  # the generalist answering the old skills with every image blanked
NEW = "new"  # the folder of a run's answers on the new skill
OLD = "old"  # the folder of a run's answers on each old skill, one sub-folder per part
RESERVED = (GENERALIST, SINGLE, "constant")
KEYS = {"study": ("base_params", "env", "seeds", "select", "points"), "generalist": None,
        "new_skill": ("env", "settings"), "point": None}


@dataclass(frozen=True)
class ForgettingStudy(StudyFolder):
    """A forgetting study's settings; paths from the repository root, where its stages run."""

    folder: Path
    base_params: Path
    env: str
    seeds: tuple[int, ...]
    select: str
    points: tuple[str, ...]
    point_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # as written, method included
    generalist: Mapping[str, Any] = field(default_factory=dict)
    new_skill: str = ""
    new_skill_settings: Mapping[str, Any] = field(default_factory=dict)

    def raw(self) -> dict[str, Any]:
        """The settings as params.yaml holds them."""
        return {"study": {"base_params": os.path.relpath(self.base_params, self.folder), "env": self.env,
                          "seeds": list(self.seeds), "select": self.select, "points": list(self.points)},
                "generalist": dict(self.generalist),
                "new_skill": {"env": self.new_skill, "settings": dict(self.new_skill_settings)},
                "point": {name: dict(self.point_settings[name]) for name in self.points}}

    def method(self, point: str) -> str:
        return self.point_settings[point]["method"]

    def generalist_settings(self) -> dict[str, Any]:
        """The generalist's settings as dotted keys of the sft section (its budget and selection rule its own: it
        trains until its val reward levels off, study.select is the points'), validated."""
        return validated_settings(CONTROL, self.generalist, self.base_params, f"{self.params_file}: generalist",
                                  own=("steps", "validation.select"))

    def settings_of(self, point: str) -> dict[str, Any]:
        """A point's settings (its method left out) as dotted keys of the section its method trains, validated."""
        if point not in self.points:
            raise ParamsError(f"{self.params_file}: {point!r} is not in study.points ({', '.join(self.points)})")
        settings = {k: v for k, v in self.point_settings[point].items() if k != "method"}
        method = self.method(point)
        return validated_settings(method, settings, self.base_params, f"{self.params_file}: point.{point}",
                                  own=BUDGET_KEYS[arm_section(method)])

    def sections(self) -> dict[str, Any]:
        """The base params' sections, checked: they train study.env, made of several envs, new_skill.env one of
        them."""
        from vlmgym import envs
        from vlmgym.params import load_section

        sections = {name: load_section(name, self.base_params) for name in SECTIONS}
        trained = sections["env"].name
        if trained != self.env:
            raise ParamsError(f"{self.params_file}: study.env is {self.env!r} but {self.base_params} trains env.name "
                              f"{trained!r}")
        if not envs.has_parts(sections["env"]):
            raise ParamsError(f"{self.base_params}: env.name {trained!r} is one env; a forgetting study trains its "
                              "generalist on an env made of several (their old skills), docs/forgetting.md")
        if self.new_skill not in envs.parts(sections["env"]):
            raise ParamsError(f"{self.params_file}: new_skill.env {self.new_skill!r} is not one of the parts of "
                              f"{trained!r} ({', '.join(envs.parts(sections['env']))}), whose shards it reads")
        return sections

    def old_skills(self, sections: dict[str, Any]) -> list[str]:
        from vlmgym import envs

        return envs.parts(sections["env"])

    def part_sections(self, sections: dict[str, Any], part: str) -> dict[str, Any]:
        """The sections that train and answer one old skill on its own: its env, its shards."""
        from vlmgym import envs

        return _on_shards(sections, envs.part_params(sections["env"], part), part)

    def new_sections(self, sections: dict[str, Any]) -> dict[str, Any]:
        """The sections that teach and answer the new skill: new_skill.env with new_skill.settings over its
        section, validated as the base params' env section would be."""
        from vlmgym.params import load_section

        try:
            env = load_section("env", self.base_params, overrides={
                "name": self.new_skill, "recipe": "", self.new_skill: dict(self.new_skill_settings)})
        except ParamsError as err:
            raise ParamsError(f"{self.params_file}: new_skill.settings: {err}") from err
        return _on_shards(sections, env, self.new_skill)


def _on_shards(sections: dict[str, Any], env: Any, part: str) -> dict[str, Any]:
    shards = f"{sections['rollout'].shards_dir}/{part}"
    return {**sections, "env": env, **{name: dataclasses.replace(sections[name], shards_dir=shards)
                                        for name in ("sft", "train", "rollout")}}


def check(raw: Any, where: Path) -> None:
    """One line naming the key when `raw` (a forgetting study's params file, read) is not its settings."""
    if not isinstance(raw, Mapping) or set(raw) != set(KEYS) or not all(isinstance(raw[k] or {}, Mapping)
                                                                        for k in KEYS):
        raise ParamsError(f"{where}: expected the sections {', '.join(KEYS)} (vlmgym study new --new-skill writes "
                          "them)")
    for section, known in KEYS.items():
        unknown = set(raw[section] or {}) - set(known or ())
        if known and unknown:
            raise ParamsError(f"{where}: {section}.{sorted(unknown)[0]}: unknown key (known: {', '.join(known)})")
    study, points = raw["study"], raw["point"] or {}
    names = study.get("points")
    check_seeds(study.get("seeds"), where)
    if not isinstance(names, list) or not names or len(set(names)) < len(names) \
            or not all(isinstance(p, str) and p.isidentifier() for p in names):
        raise ParamsError(f"{where}: study.points: expected a list of distinct point names (words), got {names!r}")
    if set(points) != set(names):
        raise ParamsError(f"{where}: point: its names {sorted(points)} differ from study.points {sorted(names)}")
    for name in names:
        if name in RESERVED:
            raise ParamsError(f"{where}: study.points: {name!r} names a folder of every seed's runs "
                              f"({', '.join(RESERVED)}); call the point something else")
        if not isinstance(points[name], Mapping) or points[name].get("method") not in METHODS:
            raise ParamsError(f"{where}: point.{name}.method: expected one of {', '.join(METHODS)}, got "
                              f"{(points[name] or {}).get('method')!r}")
    if study.get("select") not in SELECT:
        raise ParamsError(f"{where}: study.select: expected one of {', '.join(SELECT)}, got {study.get('select')!r}")
    for key, value in (("study.base_params", study.get("base_params")), ("study.env", study.get("env")),
                       ("new_skill.env", (raw["new_skill"] or {}).get("env"))):
        if not isinstance(value, str) or not value:
            raise ParamsError(f"{where}: {key}: expected a string, got {value!r}")


def is_forgetting(raw: Any) -> bool:
    """Whether a study's params file, read, is a forgetting study's (it has a new_skill section)."""
    return isinstance(raw, Mapping) and "new_skill" in raw


def from_raw(raw: Mapping[str, Any], folder: Path) -> ForgettingStudy:
    study, new_skill = raw["study"], raw["new_skill"]
    return ForgettingStudy(folder=folder, base_params=base_params_of(study, folder), env=study["env"],
                           seeds=tuple(study["seeds"]),
                           select=study["select"], points=tuple(study["points"]),
                           point_settings={name: dict(raw["point"][name]) for name in study["points"]},
                           generalist=dict(raw["generalist"] or {}), new_skill=new_skill["env"],
                           new_skill_settings=dict(new_skill.get("settings") or {}))


def load(folder: str | Path) -> ForgettingStudy:
    """The forgetting study in `folder` (studies/<name>), its settings checked."""
    raw, folder = read_settings(folder, check, f"vlmgym study new {Path(folder).name} --new-skill ENV")
    return from_raw(raw, folder)
