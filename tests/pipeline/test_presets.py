"""Presets: partial params files merged over params.yaml, validated before anything is written."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from vlmgym.cli.presets import apply_preset
from vlmgym.params import ParamsError, TrainParams, load_all, merged

REPO = Path(__file__).resolve().parents[2]


def test_merge_is_recursive_for_mappings_and_replaces_lists():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 2}
    assert merged(base, {"a": {"y": [3]}, "c": 4}) == {"a": {"x": 1, "y": [3]}, "b": 2, "c": 4}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 2}  # the inputs are left alone


def test_micro_preset_applies_to_the_repo_params(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text())
    sections = apply_preset(REPO / "configs/micro.yaml", params)
    assert (sections["data"].train_images, sections["data"].test_images) == (64, 16)
    assert sections["train"].steps == 2 and sections["model"].tiny_num_layers == 2
    # a sub-section's keys the preset leaves out keep what params.yaml holds (micro sets only its warmup)
    assert sections["train"].optimizer.warmup_steps == 1 and sections["train"].optimizer.lr == 1e-4
    assert load_all(params)["sft"].steps == 4  # what was written reads back the same
    assert params.read_text().startswith("# vlmgym pipeline parameters")  # header comment kept
    steps_doc = next(f.metadata["doc"] for f in dataclasses.fields(TrainParams) if f.name == "steps")
    assert f"steps: 2  # {steps_doc}" in params.read_text()  # every key keeps its doc comment


def test_a_bad_preset_leaves_params_untouched(tmp_path):
    params = tmp_path / "params.yaml"
    original = (REPO / "params.yaml").read_text()
    params.write_text(original)
    preset = tmp_path / "bad.yaml"
    preset.write_text(yaml.safe_dump({"train": {"lrr": 0.1}}))
    with pytest.raises(ParamsError, match="train.lrr"):
        apply_preset(preset, params)
    assert params.read_text() == original
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_the_zoom_demo_overlays_digits_recipe_and_the_zoom_preset(tmp_path):
    from vlmgym.cli.recipes import recipe_overlay

    params, recipe = tmp_path / "params.yaml", tmp_path / "recipe.yaml"
    params.write_text((REPO / "params.yaml").read_text())
    recipe.write_text(yaml.safe_dump(recipe_overlay("digits")))
    apply_preset(recipe, params)
    apply_preset(REPO / "configs/zoom.yaml", params)
    sections = apply_preset(REPO / "configs/zoom_demo.yaml", params)
    assert sections["env"].name == sections["env"].recipe == "digits"
    digits = yaml.safe_load(params.read_text())["env"]["digits"]
    assert digits["tools"] == ["zoom"] and digits["max_turns"] == 2
    # the demo's cuts, and what it keeps of the recipe
    assert (sections["data"].train_images, sections["sft"].steps, sections["train"].steps) == (4000, 80, 10)
    assert sections["sft"].freeze == "vision" and sections["sft"].perception.steps == 600


def test_the_quick_preset_sits_between_micro_and_the_defaults_and_keeps_grpos_last_step(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text())
    defaults = load_all(params)
    quick = apply_preset(REPO / "configs/quick.yaml", params, on_top=False)
    micro = apply_preset(REPO / "configs/micro.yaml", params, on_top=False)
    for section, key in [("data", "train_images"), ("data", "test_images"), ("sft", "steps"), ("train", "steps")]:
        values = [getattr(s[section], key) for s in (micro, quick, defaults)]
        assert values == sorted(values) and len(set(values)) == 3, (section, key, values)
    # the trained policy is what its steps did, never the SFT start picked back by validation, so SFT and GRPO differ
    assert quick["train"].validation.select == "last" and quick["train"].steps > 0
    assert quick["rollout"].policies == defaults["rollout"].policies  # the same comparison as the default
    readme = (REPO / "README.md").read_text()
    assert "vlmgym preset configs/quick.yaml && .venv/bin/dvc repro" in readme


# The published Qwen2.5-VL recipes: the source's settings (its script at a commit, named in the header) and the
# shapes `vlmgym plan` plans from them, without the weights (the prompt's tokens are a flag: the envs' questions
# depend on each sample).
QWEN25_RECIPES = {
    "qwen25vl_3b_rec.yaml": {"env": "rec", "source": ("om-ai-lab/VLM-R1", "run_scripts/run_grpo_rec.sh"),
                             "plan": ["--image", "476x644", "--seq", "480"],
                             "train": {"group_size": 8, "batch_prompts": 16, "micro_batches": 2, "max_new_tokens": 2048,
                                       "remat": "layer", "freeze": "none", "mesh": [1, 8, 1]},
                             "lr": 1e-6, "beta": 0.04, "temperature": 0.9},
    "qwen25vl_3b_digits.yaml": {"env": "digits",
                                "source": ("groundlight/r1_vlm",
                                           "src/r1_vlm/environments/digit_recognition_env/train.py"),
                                "plan": ["--seq", "200"],
                                "train": {"group_size": 15, "batch_prompts": 4, "micro_batches": 4,
                                          "max_new_tokens": 512, "remat": "none", "freeze": "none",
                                          "mesh": [1, 4, 1]},
                                "lr": 1e-6, "beta": 0.001, "temperature": 1.0},
}


@pytest.mark.parametrize("name", sorted(QWEN25_RECIPES))
def test_published_qwen25_recipes_merge_validate_and_name_their_source(name, tmp_path):
    import re

    expected = QWEN25_RECIPES[name]
    text = " ".join(line.lstrip("#").strip() for line in (REPO / "configs" / name).read_text().splitlines())
    repo, path = expected["source"]
    assert re.search(rf"github\.com/{re.escape(repo)}, {re.escape(path)} at commit [0-9a-f]{{40}}", text), name
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text())
    sections = apply_preset(REPO / "configs" / name, params, on_top=False)
    assert sections["model"].source == "hf:Qwen/Qwen2.5-VL-3B-Instruct" and sections["env"].name == expected["env"]
    train = sections["train"]
    assert {key: getattr(train, key) for key in expected["train"]} == expected["train"]
    assert (train.optimizer.lr, train.objective.beta, train.sampling.temperature) == (
        expected["lr"], expected["beta"], expected["temperature"])
    assert sections["sft"].steps == 0  # RL from the Instruct model, as the source


@pytest.mark.parametrize("name", sorted(QWEN25_RECIPES))
def test_published_qwen25_recipes_plan_the_3b_model_on_paper(name):
    from vlmgym.plan.cli import parse_args
    from vlmgym.plan.shapes import plan_config

    expected = QWEN25_RECIPES[name]
    spec, args = parse_args(["--params", str(REPO / "configs" / name), *expected["plan"]])
    train = expected["train"]
    assert spec.config == "qwen2.5-3b" and spec.param_dtype == "bf16"
    assert args.shapes_from["config"] == "model.source hf:Qwen/Qwen2.5-VL-3B-Instruct (the shipped qwen2_5_vl_3b.json)"
    assert (spec.batch, spec.group, spec.micro_batches, spec.answer, spec.remat, list(spec.mesh)) == (
        train["batch_prompts"] * train["group_size"], train["group_size"], train["micro_batches"],
        train["max_new_tokens"], train["remat"], train["mesh"])
    cfg = plan_config(spec.config, spec.dtype, spec.param_dtype)
    assert (cfg.family, cfg.vision.patch_size, cfg.text.num_hidden_layers, cfg.tie_word_embeddings) == (
        "qwen2_5_vl", 14, 36, True)
    assert spec.image[0] % 28 == 0 and spec.image[1] % 28 == 0  # Qwen2.5-VL's 28-pixel merged patches
