"""`vlmgym bench episodes`: two-turn zoom episodes timed turn by turn, and the share of turn 1's prompt that repeats
what turn 0 already computed."""

from __future__ import annotations

import json

import pytest

from vlmgym.bench import episodes


def test_bench_episodes_times_both_turns_and_bounds_what_a_kv_cache_would_save(bench_model_dir, capsys):
    assert episodes.main(["--model", str(bench_model_dir), "--prompts", "2", "--group", "2",
                          "--max-new-tokens", "4", "--repeats", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["episodes"] == 4 and out["list_tools"] is False
    first, second = out["turn_0"], out["turn_1"]
    # turn 1's prompt is turn 0's, the call, and the tool's reply with the crop's image tokens
    assert second["prompt_tokens_mean"] > first["prompt_tokens_mean"]
    repeated = out["repeated_share"] * second["prompt_tokens_mean"]
    assert first["prompt_tokens_mean"] < repeated < second["prompt_tokens_mean"]
    for turn in (first, second):
        assert turn["prefill_s"] > 0 and turn["decode_s"] > 0
        assert turn["total_s"] == pytest.approx(turn["prefill_s"] + turn["decode_s"])
    assert 0 < out["reprefill_saving_bound"] < out["reprefill_share"] < 1


def test_bench_episodes_rejects_bad_counts():
    with pytest.raises(SystemExit):
        episodes.main(["--prompts", "0"])
