"""What each seed of `vlmgym compare --seeds N` trains from, and its results over seeds (no training here; the
micro-pipeline run is tests/pipeline/test_compare.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmgym.compare.command import arm_config
from vlmgym.compare.seeds import per_seed_table, seed_plan, seed_results
from vlmgym.eval.metrics import evaluate_policies
from vlmgym.params import LoRAParams, PerceptionParams, SFTParams, TrainParams


def nlvr2_records(answers, order=None):
    records = [{"id": f"s{i}", "answer": a, "pred_label": a == "True", "reward": float((a == "True") == (i % 2 == 0)),
                "format_ok": True, "truth": {"label": i % 2 == 0, "sentence": "There is a red circle."}}
               for i, a in enumerate(answers)]
    return [records[i] for i in order] if order else records


def test_one_seed_gives_exactly_evaluate_policies_figures():
    sft = nlvr2_records(["True"] * 12)
    grpo = nlvr2_records(["True", "False", "False"] * 4, order=list(range(11, -1, -1)))  # pairing goes by id
    expected = evaluate_policies("nlvr2", {"sft": sft, "grpo": grpo}, comparisons=[("grpo", "sft")], n_resamples=50,
                                 seed=3, confidence=0.9)
    assert seed_results("nlvr2", [{"sft": sft, "grpo": grpo}], ["grpo"], n_resamples=50, seed=3,
                        confidence=0.9) == expected


def test_several_seeds_report_the_mean_and_each_seed():
    per_seed = [{"sft": nlvr2_records(["True"] * 8), "grpo": nlvr2_records(["True", "False"] * 4)},
                {"sft": nlvr2_records(["False"] * 8), "grpo": nlvr2_records(["True", "False"] * 4)}]
    results = seed_results("nlvr2", per_seed, ["grpo"], n_resamples=50, seed=0, confidence=0.95)
    assert set(results) == {"sft", "grpo", "grpo_minus_sft"}
    difference = results["grpo_minus_sft"]
    assert difference["seeds"] == 2 and difference["n"] == 8
    seeds = [difference["mean_reward_seed0"], difference["mean_reward_seed1"]]
    assert seeds == pytest.approx([1.0 - 0.5, 1.0 - 0.5])  # grpo right on every sample; sft on half, either seed
    assert difference["mean_reward"] == pytest.approx(sum(seeds) / 2)
    table = per_seed_table(results, [0, 1])
    assert "| policy | seed 0 | seed 1 | mean |" in table and "| grpo_minus_sft | +0.500 | +0.500 | +0.500 |" in table


def test_baselines_get_their_figures_and_sft_minus_each():
    per_seed = [{"sft": nlvr2_records(["True", "False"] * 4), "grpo": nlvr2_records(["True"] * 8),
                 "constant": nlvr2_records(["True"] * 8), "sft_blind": nlvr2_records(["False"] * 8)}
                for _ in range(2)]
    results = seed_results("nlvr2", per_seed, ["grpo"], n_resamples=50, seed=0, confidence=0.95,
                           baselines=["constant", "sft_blind"])
    assert set(results) == {"sft", "grpo", "constant", "sft_blind", "grpo_minus_sft", "sft_minus_constant",
                            "sft_minus_sft_blind"}
    # sft right on every sample; the constant "True" on the even half, the blind "False" on the odd half
    assert results["sft_minus_constant"]["mean_reward"] == pytest.approx(0.5)
    assert results["sft_minus_sft_blind"]["mean_reward"] == pytest.approx(0.5)
    assert results["constant"]["mean_reward"] == pytest.approx(0.5) and results["constant"]["seeds"] == 2


def test_a_variant_is_paired_with_the_arm_it_varies_seed_by_seed():
    # seed 0: the variant right where grpo is wrong on 2 of 8; seed 1: the same answers (no change)
    per_seed = [{"sft": nlvr2_records(["True"] * 8), "grpo": nlvr2_records(["True"] * 8),
                 "gspo": nlvr2_records(["True", "False"] * 2 + ["True"] * 4)},
                {"sft": nlvr2_records(["True"] * 8), "grpo": nlvr2_records(["True"] * 8),
                 "gspo": nlvr2_records(["True"] * 8)}]
    results = seed_results("nlvr2", per_seed, ["grpo", "gspo"], n_resamples=50, seed=0, confidence=0.95,
                           comparisons=[("gspo", "grpo")])
    assert set(results) == {"sft", "grpo", "gspo", "grpo_minus_sft", "gspo_minus_sft", "gspo_minus_grpo"}
    knob = results["gspo_minus_grpo"]
    assert [knob["mean_reward_seed0"], knob["mean_reward_seed1"]] == pytest.approx([0.25, 0.0])
    assert knob["mean_reward"] == pytest.approx(
        results["gspo_minus_sft"]["mean_reward"] - results["grpo_minus_sft"]["mean_reward"])


def sections(sft=None, train=None):
    return {"sft": sft or SFTParams(), "train": train or TrainParams()}


def test_seeds_from_a_first_seed_and_the_options_checked_before_any_work(tmp_path, capsys):
    from vlmgym.compare.command import main
    from vlmgym.compare.seeds import seed_numbers

    assert seed_numbers(1) == [] and seed_numbers(3) == [0, 1, 2] and seed_numbers(3, 5) == [5, 6, 7]
    for argv, message in ((["--first-seed", "3"], "--first-seed 3: needs --seeds N > 1"),
                          (["--seeds", "3", "--first-seed", "5", "--only-seed", "2"], "a seed in 5..7"),
                          (["--seeds", "3", "--only-seed", "3"], "a seed in 0..2")):
        with pytest.raises(SystemExit):
            main([*argv, "--params", str(tmp_path / "none.yaml")])
        assert message in capsys.readouterr().err


def test_the_configured_seed_reuses_the_pipelines_sft_model_and_others_train_their_own(tmp_path):
    base = sections()
    same, config = seed_plan(base, 0, tmp_path / "seed0", Path("checkpoints/compare/seed0"))
    assert config is None and same["train"].init_dir == "models/jax/sft" and same["train"].seed == 0
    other, config = seed_plan(base, 1, tmp_path / "seed1", Path("checkpoints/compare/seed1"))
    assert config.seed == 1 and config.init_dir == "models/jax/base" and config.steps == base["sft"].steps
    assert config.out_dir == str(tmp_path / "seed1/sft/model") == other["train"].init_dir
    assert config.checkpointing.dir == "checkpoints/compare/seed1/sft"
    assert other["train"].seed == 1 and other["sft"].seed == 1 and other["train"].lora.seed == 0  # no adapters


def test_adapters_get_the_seed_too_and_a_pass_through_sft_is_the_base_model(tmp_path):
    lora = LoRAParams(rank=4)
    plan, config = seed_plan(sections(SFTParams(lora=lora), TrainParams(lora=lora)), 2, tmp_path, tmp_path)
    assert config.lora.seed == 2 and plan["train"].lora.seed == 2
    # seed 0 with adapters seeded 0 is the configured sft section: the pipeline's model is reused
    assert seed_plan(sections(SFTParams(lora=lora), TrainParams(lora=lora)), 0, tmp_path, tmp_path)[1] is None
    plan, config = seed_plan(sections(SFTParams(steps=0), TrainParams(init_dir="elsewhere")), 1, tmp_path, tmp_path)
    assert config is None and plan["train"].init_dir == "models/jax/base"


def test_a_perception_warm_up_gets_the_seed_too(tmp_path):
    warmed = SFTParams(perception=PerceptionParams(steps=100))
    plan, config = seed_plan(sections(warmed), 3, tmp_path, tmp_path)
    assert config.perception.seed == 3 and config.perception.steps == 100 and plan["sft"].perception.seed == 3
    assert seed_plan(sections(warmed), 0, tmp_path, tmp_path)[1] is None  # seed 0 is the pipeline's warm-up
    assert seed_plan(sections(), 3, tmp_path, tmp_path)[1].perception == PerceptionParams()  # none: left as it is
    # sft_longer continues the SFT model, whose tower is warmed already: it does not warm it up again
    longer = arm_config("sft_longer", sections(warmed), tmp_path)
    assert longer.perception.steps == 0 and longer.init_dir == "models/jax/sft"


def test_the_headline_table_has_a_row_per_policy_and_a_column_per_split():
    from vlmgym.compare.command import headline_table

    figures = {"mean_reward": 0.25, "mean_reward_ci_low": 0.125, "mean_reward_ci_high": 0.5}
    difference = {"mean_reward": 0.03, "mean_reward_ci_low": -0.01, "mean_reward_ci_high": 0.07}
    table = headline_table({"test": {"sft": figures, "grpo_minus_sft": difference},
                            "test_ood": {"sft": figures, "grpo_minus_sft": {}}})
    assert table.splitlines() == ["| policy | test | test_ood |", "|---|---|---|",
                                  "| sft | 0.250 [0.125, 0.500] | 0.250 [0.125, 0.500] |",
                                  "| grpo_minus_sft | +0.030 [-0.010, +0.070] | n/a [n/a, n/a] |"]
