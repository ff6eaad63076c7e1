"""`vlmgym bench reward` runs and prints its figures as JSON (the speed itself is read off the benchmark)."""

import json

from vlmgym.bench import reward as bench_reward


def test_bench_reward_prints_json(capsys):
    assert bench_reward.main(["--samples", "10", "--answers", "70", "--seed", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["answers"] == 70 and result["rewards_per_s"] > 0 and result["rewards_per_cpu_s"] > 0
    assert 0 < result["mean_reward"] < 1


def test_bench_cases_are_deterministic():
    assert bench_reward.make_cases(5, 30, seed=1)[1] == bench_reward.make_cases(5, 30, seed=1)[1]
