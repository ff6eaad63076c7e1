"""`vlmgym compare --variant NAME=KEY=VALUE[,...]`: an arm that is the train section with some keys changed, parsed
and validated as params.yaml's train section would be (no training here; tests/pipeline/test_compare.py runs one)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from vlmgym.compare.command import arm_config, parse_variants
from vlmgym.compare.seeds import seed_plan
from vlmgym.params import ParamsError, SFTParams, TrainParams, with_values


@pytest.fixture
def params_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"train": {"group_size": 8, "optimizer": {"lr": 1e-4, "warmup_steps": 2}}}))
    return str(path)


def test_a_variant_is_the_train_section_with_its_keys_changed_under_canonical_names(params_file, tmp_path):
    variants = parse_variants(["gspo=importance_sampling_level=sequence",
                               "filtered=filter_groups=true, filter_metric=correct",
                               "trl=loss_type=grpo,num_generations=4,optimizer.min_lr_rate=0.1",
                               "slow=optimizer.lr=3e-5,validation.every=5"], params_file)
    assert variants == {"gspo": {"importance_sampling_level": "sequence"},
                        "filtered": {"filter_groups": True, "filter_metric": "correct"},
                        # TRL's names become vlmgym's keys and values, as `vlmgym params` prints them
                        "trl": {"loss_aggregation": "sequence_mean", "group_size": 4, "optimizer.end_lr_ratio": 0.1},
                        # a sub-section's key, dotted; its other keys stay as the file (and train's defaults) set them
                        "slow": {"optimizer.lr": 3e-5, "validation.every": 5}}
    sections = {"train": with_values(TrainParams(group_size=8, seed=5), {"optimizer.lr": 1e-4}), "sft": SFTParams()}
    config = arm_config("gspo", sections, tmp_path / "out", Path("checkpoints/compare"), variants)
    assert config == with_values(TrainParams(group_size=8, seed=5, importance_sampling_level="sequence",
                                             out_dir=str(tmp_path / "out/gspo/model")), {
        "optimizer.lr": 1e-4, "checkpointing.dir": "checkpoints/compare/gspo"})
    slow = arm_config("slow", sections, tmp_path / "out", Path("checkpoints/compare"), variants)
    assert slow.optimizer == replace(sections["train"].optimizer, lr=3e-5) and slow.validation.every == 5
    assert slow.validation.select == "best_val" and slow.checkpointing.dir == "checkpoints/compare/slow"
    # the plain arms are as before
    assert arm_config("grpo", sections, tmp_path / "out", variants=variants).importance_sampling_level == "token"


def test_each_seed_trains_its_variant_from_its_own_start_with_its_own_seed(params_file, tmp_path):
    variants = parse_variants(["entropy=top_entropy_quantile=0.2"], params_file)
    plan, _ = seed_plan({"train": TrainParams(), "sft": SFTParams()}, 2, tmp_path / "seed2", tmp_path / "ck")
    config = arm_config("entropy", plan, tmp_path / "seed2", tmp_path / "ck", variants)
    assert config.seed == 2 and config.init_dir == str(tmp_path / "seed2/sft/model")
    assert config.top_entropy_quantile == 0.2 and config.out_dir == str(tmp_path / "seed2/entropy/model")


@pytest.mark.parametrize(("spec", "message"), [
    ("grpo=lr=1e-3", "the name 'grpo' is taken"),
    ("sft_blind=lr=1e-3", "the name 'sft_blind' is taken"),
    ("two words=lr=1e-3", "with NAME a word"),
    ("lr", "with NAME a word"),
    ("fast=lr", "'lr' is not KEY=VALUE"),
    ("fast=lr=1e-3,", "'' is not KEY=VALUE"),
    ("fast=seed=3", "seed is set by compare"),
    ("fast=out_dir=elsewhere", "out_dir is set by compare"),
    ("fast=checkpointing.dir=x", "checkpointing.dir is set by compare"),
])
def test_a_malformed_variant_is_an_error_naming_it(params_file, spec, message):
    with pytest.raises(ValueError, match=message) as raised:
        parse_variants([spec], params_file)
    assert spec in str(raised.value)


@pytest.mark.parametrize(("spec", "message"), [
    ("fast=optimizer.lr=abc", r"train.optimizer.lr: expected a number"),
    ("fast=no_such_key=1", "train.no_such_key: unknown key"),
    ("gspo=importance_sampling_level=sentence", "is not one of"),
    ("both=num_generations=4,group_size=4", "num_generations is another name for group_size"),
])
def test_a_variant_is_validated_as_the_params_file_would_be(params_file, spec, message):
    with pytest.raises(ParamsError, match=message) as raised:
        parse_variants([spec], params_file)
    assert f"--variant {spec!r}" in str(raised.value) or "--variant both" in str(raised.value)


def test_two_variants_may_not_share_a_name(params_file):
    with pytest.raises(ValueError, match="the name 'a' is taken"):
        parse_variants(["a=optimizer.lr=1e-3", "a=optimizer.lr=3e-4"], params_file)


def test_ppo_is_refused_up_front_for_an_env_with_tools(tmp_path, capsys):
    from vlmgym.compare.command import main

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"env": {"name": "digits", "digits": {"tools": ["zoom"], "max_turns": 2}}}))
    with pytest.raises(SystemExit):
        main(["--params", str(path), "--arms", "grpo", "ppo"])
    assert "--arms ppo: env 'digits' runs episodes with tools" in capsys.readouterr().err
