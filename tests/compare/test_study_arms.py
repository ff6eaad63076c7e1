"""A study's arms: the section each trains with (one selection rule for all, sft_longer matched on sequences) and
its settings, validated as the params file's section would be (no training here)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from vlmgym.compare.arms import (
    arm_config,
    rl_step_flops,
    sft_compute_steps,
    sft_longer_steps,
    sft_step_flops,
    validated_settings,
)
from vlmgym.params import ParamsError, SFTParams, TrainParams, with_values


@pytest.fixture
def params_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"train": {"group_size": 8, "optimizer": {"lr": 1e-4, "warmup_steps": 2}}}))
    return str(path)


def sections():
    return {"train": with_values(TrainParams(group_size=8, seed=5, init_dir="start"), {"optimizer.lr": 1e-4}),
            "sft": SFTParams(seed=5)}


def test_sft_longer_trains_on_as_many_sequences_as_an_rl_arm_samples(tmp_path):
    config = arm_config("sft_longer", sections(), tmp_path, Path("ck"), select="best_val")
    train = sections()["train"]
    assert config.steps == sft_longer_steps(train, SFTParams()) == -(-150 * 8 * 8 // 16)
    assert config.init_dir == "start" and config.seed == 5 and config.out_dir == str(tmp_path / "sft_longer/model")
    assert config.checkpointing.dir == "ck/sft_longer"


def test_sft_compute_trains_for_the_flops_of_the_rl_arms_steps():
    train, sft = TrainParams(steps=150, batch_prompts=8, group_size=8, max_new_tokens=64), SFTParams(batch_size=16)
    # per step and parameter: sampling 2 x (8 prompts x 60 + 64 answers x 64), the learner 6 x the same (one prompt
    # per group), no reference (beta 0) and no recomputed log-probs
    positions = 8 * 60 + 64 * 64
    assert rl_step_flops(train, 60) == 8 * positions
    assert sft_step_flops(sft, 60) == 6 * 16 * (60 + sft.max_target_tokens)
    assert sft_compute_steps(train, sft, 60) == -(-150 * 8 * positions // (6 * 16 * (60 + 64)))
    # a KL reference adds a forward over the learner's positions; a copy of the prompt per answer, 64 prompts
    assert rl_step_flops(with_values(train, {"objective.beta": 0.01}), 60) == 10 * positions
    assert rl_step_flops(replace(train, share_prefix=False), 60) == 2 * positions + 6 * 64 * (60 + 64)
    # two updates per sampled batch: the learner's forward and backward twice
    assert rl_step_flops(replace(train, num_iterations=2), 60) == 14 * positions


def test_every_arm_ends_by_the_studys_one_selection_rule(tmp_path):
    for select in ("best_val", "last"):
        configs = [arm_config(arm, sections(), tmp_path, Path("ck"), select=select)
                   for arm in ("sft_longer", "grpo", "dpo")]
        assert {c.validation.select for c in configs} == {select}
    # without one each keeps its section's own (sft: last, train: best_val)
    assert arm_config("sft_longer", sections(), tmp_path, Path("ck")).validation.select == "last"


def test_a_variant_is_the_train_section_with_its_settings(params_file, tmp_path):
    settings = validated_settings("gspo", {"objective": {"importance_sampling_level": "sequence"},
                                           "optimizer": {"lr": 3e-5}}, params_file, "arm.gspo")
    assert settings == {"objective.importance_sampling_level": "sequence", "optimizer.lr": 3e-5}
    config = arm_config("gspo", sections(), tmp_path, Path("ck"), settings, select="last")
    assert config == with_values(sections()["train"], {
        "objective.importance_sampling_level": "sequence", "optimizer.lr": 3e-5, "validation.select": "last",
        "out_dir": str(tmp_path / "gspo/model"), "checkpointing.dir": "ck/gspo"})
    # the objective's keys written flat (as study files before train.objective hold them) are the same settings
    assert validated_settings("gspo", {"importance_sampling_level": "sequence", "optimizer.lr": 3e-5}, params_file,
                              "arm.gspo") == settings
    # TRL's names become vlmgym's keys, as `vlmgym params` prints them
    assert validated_settings("grpo", {"loss_type": "grpo", "beta": 0.01, "optimizer.min_lr_rate": 0.1}, params_file,
                              "arm.grpo") == {
        "objective.loss_aggregation": "sequence_mean", "objective.beta": 0.01, "optimizer.end_lr_ratio": 0.1}
    with pytest.raises(ValueError, match="unknown arm 'gspo'"):
        arm_config("gspo", sections(), tmp_path, Path("ck"))


@pytest.mark.parametrize(("arm", "settings", "message"), [
    ("grpo", {"seed": 3}, "arm.grpo.seed: set by the study"),
    ("grpo", {"checkpointing": {"dir": "x"}}, "arm.grpo.checkpointing.dir: set by the study"),
    ("grpo", {"validation.select": "last"}, "arm.grpo.validation.select: set by the study"),
    ("grpo", {"algorithm": "ppo"}, "arm.grpo.algorithm: set by the study"),
    ("grpo", {"steps": 10}, "arm.grpo.steps: every arm trains at the budget of"),
    ("grpo", {"num_generations": 4}, "arm.grpo.group_size: every arm trains at the budget"),
    ("sft_longer", {"steps": 10}, "arm.sft_longer.steps: every arm trains at the budget"),
    ("grpo", {"optimizer": {"lr": "abc"}}, r"train.optimizer.lr: expected a number"),
    ("grpo", {"no_such_key": 1}, "train.no_such_key: unknown key"),
    ("sft_longer", {"group_size": 2}, "sft.group_size: unknown key"),
    ("gspo", {"importance_sampling_level": "sentence"}, "is not one of"),
    ("grpo", {"beta": 0.01, "objective": {"beta": 0.02}}, "arm.grpo.beta is another name for arm.grpo.objective.beta"),
    ("grpo", {"loss_type": "grpo", "objective.loss_aggregation": "dr_grpo"},
     "arm.grpo.loss_type is another name for arm.grpo.objective.loss_aggregation"),
])
def test_wrong_settings_are_one_line_naming_the_arm_and_key(params_file, arm, settings, message):
    with pytest.raises(ParamsError, match=message) as raised:
        validated_settings(arm, settings, params_file, f"arm.{arm}")
    assert f"arm.{arm}" in str(raised.value) and "\n" not in str(raised.value)


def test_a_variant_may_pick_its_algorithm(params_file):
    assert validated_settings("rloo_slow", {"algorithm": "rloo", "optimizer.lr": 1e-5}, params_file, "arm.x") == {
        "algorithm": "rloo", "optimizer.lr": 1e-5}
