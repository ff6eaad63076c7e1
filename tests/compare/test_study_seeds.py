"""What each seed of a study trains from, and its results over seeds: the t-interval as the interval with several
seeds, the two-level bootstrap beside it (no training here; tests/compare/test_study_pipeline.py runs a study)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmgym.compare.arms import arm_config
from vlmgym.compare.seeds import per_seed_table, seed_results, seed_sections, start_config
from vlmgym.eval.metrics import evaluate_policies
from vlmgym.params import LoRAParams, PerceptionParams, SFTParams, TrainParams
from vlmgym.stats.seed_interval import seed_t_interval


def nlvr2_records(answers, order=None):
    records = [{"id": f"s{i}", "answer": a, "pred_label": a == "True", "reward": float((a == "True") == (i % 2 == 0)),
                "format_ok": True, "truth": {"label": i % 2 == 0, "sentence": "There is a red circle."}}
               for i, a in enumerate(answers)]
    return [records[i] for i in order] if order else records


def right_on(count):
    """Answers right on the first `count` of 8 samples (the truth alternates True, False), wrong on the rest."""
    truth = ["True", "False"] * 4
    return nlvr2_records([a if i < count else ("False" if a == "True" else "True") for i, a in enumerate(truth)])


def test_one_seed_gives_exactly_evaluate_policies_figures():
    sft = nlvr2_records(["True"] * 12)
    grpo = nlvr2_records(["True", "False", "False"] * 4, order=list(range(11, -1, -1)))  # pairing goes by id
    expected = evaluate_policies("nlvr2", {"sft": sft, "grpo": grpo}, comparisons=[("grpo", "sft")], n_resamples=50,
                                 seed=3, confidence=0.9)
    assert seed_results("nlvr2", [{"sft": sft, "grpo": grpo}], ["grpo"], n_resamples=50, seed=3,
                        confidence=0.9) == expected


def test_several_seeds_report_the_mean_each_seed_and_the_t_interval_with_the_bootstrap_beside_it():
    # grpo right on every sample; sft right on 4, 5 and 7 of 8 samples on the three seeds
    per_seed = [{"sft": right_on(right), "grpo": right_on(8)} for right in (4, 5, 7)]
    results = seed_results("nlvr2", per_seed, ["grpo"], n_resamples=200, seed=0, confidence=0.95)
    assert set(results) == {"sft", "grpo", "grpo_minus_sft"}
    difference = results["grpo_minus_sft"]
    assert difference["seeds"] == 3 and difference["n"] == 8
    points = [difference[f"mean_reward_seed{k}"] for k in range(3)]
    assert points == pytest.approx([0.5, 0.375, 0.125])
    assert difference["mean_reward"] == pytest.approx(sum(points) / 3)
    t = seed_t_interval(points, 0.95)
    assert (difference["mean_reward_ci_low"], difference["mean_reward_ci_high"]) == pytest.approx((t.low, t.high))
    assert difference["mean_reward_boot_low"] <= difference["mean_reward"] <= difference["mean_reward_boot_high"]
    assert (difference["mean_reward_boot_low"], difference["mean_reward_boot_high"]) != (t.low, t.high)
    table = per_seed_table(results, [5, 6, 7])
    assert "| policy | seed 5 | seed 6 | seed 7 | mean |" in table and "| grpo - sft | " in table


def test_one_seeds_table_shows_its_mean_as_that_seed():
    results = seed_results("nlvr2", [{"sft": right_on(4), "grpo": right_on(8)}], ["grpo"], n_resamples=20, seed=0,
                           confidence=0.95)
    assert "| grpo - sft | +0.500 | +0.500 |" in per_seed_table(results, [5])


def test_baselines_get_their_figures_and_sft_minus_each_after_the_comparisons():
    per_seed = [{"sft": nlvr2_records(["True", "False"] * 4), "grpo": nlvr2_records(["True"] * 8),
                 "sft_longer": nlvr2_records(["True"] * 8), "constant": nlvr2_records(["True"] * 8),
                 "sft_blind": nlvr2_records(["False"] * 8)} for _ in range(2)]
    results = seed_results("nlvr2", per_seed, ["grpo", "sft_longer"], n_resamples=50, seed=0, confidence=0.95,
                           baselines=["constant", "sft_blind"], comparisons=[("grpo", "sft_longer")])
    assert list(results)[5:] == ["grpo_minus_sft", "sft_longer_minus_sft", "grpo_minus_sft_longer",
                                 "sft_minus_constant", "sft_minus_sft_blind"]
    # sft right on every sample; the constant "True" on the even half, the blind "False" on the odd half
    assert results["sft_minus_constant"]["mean_reward"] == pytest.approx(0.5)
    assert results["sft_minus_sft_blind"]["mean_reward"] == pytest.approx(0.5)
    assert results["grpo_minus_sft_longer"]["mean_reward"] == pytest.approx(0.0)
    assert results["constant"]["mean_reward"] == pytest.approx(0.5) and results["constant"]["seeds"] == 2


def sections(sft=None, train=None):
    return {"sft": sft or SFTParams(), "train": train or TrainParams()}


def test_every_seed_trains_its_own_start_from_the_base_model(tmp_path):
    config = start_config(sections(), 0, tmp_path / "runs/0", Path("checkpoints/studies/s/0"))
    assert config.seed == 0 and config.init_dir == "models/jax/base" and config.steps == SFTParams().steps
    assert config.out_dir == str(tmp_path / "runs/0/sft/model")
    assert config.checkpointing.dir == "checkpoints/studies/s/0/sft"
    seeded = seed_sections(sections(), 1, config.out_dir)
    assert seeded["train"].init_dir == config.out_dir and seeded["train"].seed == 1 and seeded["sft"].seed == 1
    assert seeded["train"].lora.seed == 0  # no adapters


def test_adapters_and_a_perception_warm_up_get_the_seed_too(tmp_path):
    lora = LoRAParams(rank=4)
    assert start_config(sections(SFTParams(lora=lora)), 2, tmp_path, tmp_path).lora.seed == 2
    assert seed_sections(sections(train=TrainParams(lora=lora)), 2, "start")["train"].lora.seed == 2
    warmed = SFTParams(perception=PerceptionParams(steps=100))
    config = start_config(sections(warmed), 3, tmp_path, tmp_path)
    assert config.perception.seed == 3 and config.perception.steps == 100
    assert start_config(sections(), 3, tmp_path, tmp_path).perception == PerceptionParams()  # none: as it is
    # sft_longer continues the SFT model, whose tower is warmed already: it does not warm it up again
    longer = arm_config("sft_longer", seed_sections(sections(warmed), 3, "start"), tmp_path, tmp_path)
    assert longer.perception.steps == 0 and longer.init_dir == "start" and longer.seed == 3
