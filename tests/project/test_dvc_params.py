"""dvc.yaml's `params:` are as fine as the stages' reads: the env's reward and prompt settings (env.<name>.*, each
env's Params) are no deps of the data stages, so tuning a reward never reshards the data, and every key a stage
lists is one params.yaml holds (DVC stops a stage whose listed key is missing from the file)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import yaml

from vlmgym.envs import registry
from vlmgym.params import EnvParams, from_dict

REPO = Path(__file__).resolve().parents[2]
DVC = yaml.safe_load((REPO / "dvc.yaml").read_text())
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())
# The stages that read nothing of `env` but its name (and a mixture's env.mixture.envs, which DVC cannot list)
DATA_STAGES = ("download", "shard")


def declared(stage: str) -> list[str]:
    """The params.yaml keys stage `stage` lists (dotted; a section stands for every key under it)."""
    return [entry for entry in DVC["stages"][stage].get("params", []) if isinstance(entry, str)]


def covers(entry: str, key: str) -> bool:
    return key == entry or key.startswith(f"{entry}.")


def env_setting_keys() -> list[str]:
    """env.<name>.<field> of every built-in env's own settings (its Params dataclass)."""
    keys = []
    for name in registry.BUILTIN:
        cls = registry.env_class(name)
        if cls.Params is not None:
            keys += [f"env.{cls.name}.{field.name}" for field in dataclasses.fields(cls.Params)]
    return keys


def test_every_built_in_env_has_settings_to_check():
    keys = env_setting_keys()
    assert "env.geospot.format_weight" in keys and "env.digits.tools" in keys and "env.nlvr2.think" in keys


@pytest.mark.parametrize("stage", DATA_STAGES)
def test_no_env_setting_is_a_dep_of_the_data_stages(stage):
    params = declared(stage)
    deps = [key for key in env_setting_keys() if any(covers(entry, key) for entry in params)]
    assert not deps, f"dvc.yaml stage {stage!r} depends on env settings it never reads: {deps[:5]}"
    assert any(covers(entry, "env.name") for entry in params), f"{stage} reads env.name: it must list it"


def test_base_model_lists_the_whole_env_section_because_its_tokenizer_reads_keys_params_yaml_need_not_hold():
    # The tiny tokenizer is trained on the tool calls of the env's `tools` setting: a key an env's section may
    # leave out (its default then), and DVC cannot list a key missing from params.yaml. Listing env.name alone
    # would let a run with tools reuse, from DVC's run cache, a tokenizer trained without their calls.
    spec = importlib.util.spec_from_file_location("base_model_stage", REPO / "stages" / "base_model.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    with_tools = from_dict(EnvParams, {"name": "digits", "digits": {"tools": ["zoom"], "max_turns": 2}}, where="env")
    assert stage.tool_texts(with_tools) != stage.tool_texts(EnvParams(name="digits"))
    assert "tools" not in PARAMS["env"].get(PARAMS["env"]["name"], {})  # the shipped params.yaml holds none
    assert "env" in declared("base_model")


@pytest.mark.parametrize("stage", sorted(DVC["stages"]))
def test_every_listed_key_is_in_params_yaml(stage):
    missing = []
    for entry in declared(stage):
        node = PARAMS
        for part in entry.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(entry)
                break
            node = node[part]
    assert not missing, f"dvc.yaml stage {stage!r} lists keys params.yaml does not hold: {missing}"
