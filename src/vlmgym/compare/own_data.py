"""A study on another env than the repository's pipeline trains: its own pipeline params and first stages.

`vlmgym study new NAME --env E`, where the base params train another env, writes studies/NAME/pipeline.yaml: the
base params switched to E with E's recipe (vlmgym.cli.recipes, as `vlmgym recipe E` would), its raw data, shards and
base model moved under studies/NAME/. Base params that already hold E's recipe (another study's pipeline.yaml, a
params file tuned by hand) keep their settings: only the folders move, and a folder under another study's
(studies/OTHER/data/raw) moves to the same place under this one's (studies/NAME/data/raw).

The study's dvc.yaml then starts with copies of the repository pipeline's first stages (download, shard,
base_model, convert) run on that file, so the study builds the data and the base model it trains from, cached and
shared like every other stage, and the repository's own pipeline is untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vlmgym.compare.settings import STUDIES

PIPELINE = "pipeline.yaml"  # the study's own pipeline params, in its folder
HEAD = ("download", "shard", "base_model", "convert")  # the repository pipeline's stages the study copies


def head_outputs(params_file: str | Path) -> dict[tuple[str, str], str]:
    """{(section, key): folder} of the params keys that name where the first stages write."""
    from vlmgym.params import load_section

    data, shard, model = (load_section(name, params_file) for name in ("data", "shard", "model"))
    return {("data", "raw_dir"): data.raw_dir, ("shard", "out_dir"): shard.out_dir, ("model", "hf_dir"): model.hf_dir,
            ("model", "jax_dir"): model.jax_dir}


# The keys that read a first stage's output, and which output they read when they keep the default layout.
READERS = {("sft", "init_dir"): ("model", "jax_dir"), ("sft", "shards_dir"): ("shard", "out_dir"),
           ("train", "shards_dir"): ("shard", "out_dir"), ("rollout", "shards_dir"): ("shard", "out_dir")}


def _under(folder: Path, now: str) -> str:
    """`now` moved under `folder`; a path under another study's folder keeps only its part below that folder."""
    parts = Path(now).parts
    if len(parts) > 2 and parts[0] == STUDIES.name:
        parts = parts[2:]
    return f"{folder.as_posix()}/{Path(*parts).as_posix()}"


def moved(params_file: str | Path, folder: Path) -> dict[str, Any]:
    """The overlay that moves every first-stage output under `folder`, and every key reading one with it."""
    from vlmgym.params import load_section, value_at

    outputs = head_outputs(params_file)
    overlay: dict[str, Any] = {}
    for (section, key), now in outputs.items():
        overlay.setdefault(section, {})[key] = _under(folder, now)
    for (section, key), (source, source_key) in READERS.items():
        if value_at(load_section(section, params_file), key) == outputs[(source, source_key)]:
            overlay.setdefault(section, {})[key] = overlay[source][source_key]
    return overlay


def write_pipeline(folder: Path, base_params: str | Path, env: str) -> Path:
    """studies/NAME/pipeline.yaml: `base_params` switched to `env` with its recipe (unless they hold it already),
    its first stages' outputs under `folder` (module docstring)."""
    from vlmgym.params import load_section, merged, read_yaml, write_params
    from vlmgym.recipes import recipe_overlay

    path = folder / PIPELINE
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(Path(base_params).read_text())  # its leading comment is kept by write_params
    held = load_section("env", base_params)
    if (held.name, held.recipe) != (env, env):  # a base already on env's recipe keeps its own changes to it
        write_params(merged(read_yaml(base_params), recipe_overlay(env)), path, f"the recipe of {env}")
    write_params(merged(read_yaml(path), moved(path, folder)), path, f"{folder}'s own data and base model")
    return path


def own_pipeline(base_params: Path, folder: Path) -> bool:
    """Whether a study's base params are its own pipeline.yaml (so its dvc.yaml has the first stages too)."""
    return base_params == folder / PIPELINE


def head_stages(base_params: Path, code: list[str]) -> dict[str, Any]:
    """The repository dvc.yaml's first stages run on the study's pipeline.yaml (from the repository root): the same
    command with --params, deps, params read from that file, outputs where that file puts them."""
    root = yaml.safe_load(Path("dvc.yaml").read_text())["stages"]
    mine, repository = head_outputs(base_params), head_outputs("params.yaml")
    renamed = {repository[path]: mine[path] for path in mine}

    def rename(entries: list) -> list:
        return [renamed.get(e, e) if isinstance(e, str) else {renamed.get(k, k): v for k, v in e.items()}
                for e in entries]

    stages = {}
    for name in HEAD:
        spec = root[name]
        keys = [key for entry in spec.get("params", [])
                for key in ([entry] if isinstance(entry, str) else [k for v in entry.values() for k in v])]
        stages[name] = {"wdir": "../..", "cmd": f"{spec['cmd']} --params {base_params.as_posix()}",
                        "deps": list(dict.fromkeys([*code, *rename([d for d in spec.get("deps", [])
                                                                      if not d.startswith("src/")])])),
                        "params": [{base_params.as_posix(): keys}], "outs": rename(spec["outs"])}
    return stages
