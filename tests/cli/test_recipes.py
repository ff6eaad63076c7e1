"""`vlmgym recipe`: an env's recipe applied over params.yaml (--on-top; over the defaults:
tests/cli/test_preset_command.py), every other env's recipe keys reset to their defaults, and the stop when env.name
and env.recipe disagree."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from vlmgym import params as params_mod
from vlmgym.cli import recipes
from vlmgym.envs import registry
from vlmgym.envs.nlvr2 import NLVR2Env

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def params_file(tmp_path):
    path = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", path)
    return path


def test_the_default_params_hold_geospots_recipe(params_file):
    assert params_mod.load_section("env", params_file).recipe == "geospot"


def test_switching_env_name_alone_stops_with_the_command_that_applies_the_recipe(params_file):
    params_file.write_text(params_file.read_text().replace("  name: geospot", "  name: digits"))
    with pytest.raises(params_mod.ParamsError, match="vlmgym recipe digits"):
        params_mod.load_section("env", params_file)


def test_a_recipe_sets_its_keys_and_another_envs_keys_go_back_to_their_defaults(params_file, monkeypatch):
    monkeypatch.setattr(NLVR2Env, "recipe", {"sft": {"optimizer": {"lr": 0.001}, "steps": 300}})
    assert recipes.main(["nlvr2", "--on-top", "--params", str(params_file)]) == 0
    sections = params_mod.load_all(params_file)
    assert (sections["env"].name, sections["env"].recipe) == ("nlvr2", "nlvr2")
    assert (sections["sft"].optimizer.lr, sections["sft"].steps) == (0.001, 300)
    # geospot's recipe keys go back to their defaults; the rest of train is untouched
    default_train = params_mod.load_all(REPO / "params.yaml")["train"]
    assert sections["train"].sampling.temperature == 1.0 and default_train.sampling.temperature == 0.6
    assert sections["train"] == replace(default_train, sampling=replace(default_train.sampling, temperature=1.0))
    # digits' recipe leaves sft.optimizer.lr out
    assert recipes.main(["digits", "--on-top", "--params", str(params_file)]) == 0
    sections = params_mod.load_all(params_file)
    assert (sections["env"].name, sections["sft"].optimizer.lr, sections["sft"].steps) == ("digits", 0.003, 600)


def test_the_overrides_are_dvc_exp_run_arguments_that_survive_word_splitting(monkeypatch):
    monkeypatch.setattr(NLVR2Env, "recipe", {"sft": {"optimizer": {"lr": 0.001}, "lora": {"targets": ["q", "v"]}}})
    # `$(...)` splits on whitespace and keeps quotes: what dvc receives
    words = " ".join(recipes.overrides(recipes.recipe_overlay("nlvr2"))).split()
    assert words[::2] == ["-S"] * len(words[1::2])
    assert words[1::2] == ["++env.name=nlvr2", "++env.recipe=nlvr2", "++sft.optimizer.lr=0.001",
                           '++sft.lora.targets=["q","v"]', "++sft.freeze=none", "++sft.perception.steps=0",
                           "++sft.perception.optimizer.lr=0.003", "++sft.steps=600", "++sft.max_target_tokens=64",
                           "++sft.validation.every=100",
                           "++data.train_images=2000",
                           "++data.image_width=256", "++data.image_height=192", "++train.optimizer.lr=0.0001",
                           "++train.sampling.temperature=1.0", "++train.max_new_tokens=64", "++model.max_pixels=12288",
                           "++rollout.max_new_tokens=64"]  # ovd's recipe sets the three token budgets


@pytest.mark.parametrize("env", sorted(registry.names()))
def test_dvc_applies_every_recipes_overrides_to_the_default_params(env, params_file):
    """What `dvc exp run $(vlmgym recipe <env> --overrides)` does to params.yaml (dvc's own hydra overrides), also
    for keys the default params leave out (message_decoding's generator section): what --on-top writes."""
    from dvc.utils.hydra import apply_overrides

    words = recipes.overrides(recipes.recipe_overlay(env))
    apply_overrides(str(params_file), words[1::2])
    expected = params_file.with_name("applied.yaml")
    shutil.copy(REPO / "params.yaml", expected)
    assert recipes.main([env, "--on-top", "--params", str(expected)]) == 0
    assert params_mod.load_all(params_file) == params_mod.load_all(expected)


def test_a_recipe_outside_the_sections_it_may_set_is_an_error(monkeypatch):
    monkeypatch.setattr(NLVR2Env, "recipe", {"env": {"nlvr2": {"trace": False}}})
    with pytest.raises(params_mod.ParamsError, match="other than env"):
        recipes.recipe_overlay("nlvr2")
    monkeypatch.setattr(NLVR2Env, "recipe", {"sft": {"nope": 1}})
    with pytest.raises(params_mod.ParamsError, match="sft.nope: no such key"):
        recipes.recipe_overlay("nlvr2")


def test_geospots_recipe_is_what_the_default_params_hold(params_file):
    overlay = recipes.recipe_overlay("geospot")
    assert overlay["sft"]["steps"] == 450 and overlay["train"]["sampling"]["temperature"] == 0.6
    before = params_mod.load_all(params_file)
    assert recipes.main(["geospot", "--on-top", "--params", str(params_file)]) == 0
    assert params_mod.load_all(params_file) == before  # params.yaml holds geospot's recipe


def test_every_built_in_recipe_validates(params_file):
    for name in registry.names():
        assert recipes.main([name, "--params", str(params_file)]) == 0, name
        assert params_mod.load_all(params_file)["env"].name == name
