"""Multi-turn episodes' figures: turns, tool calls and their validity, and the reward by number of turns."""

from __future__ import annotations

import pytest

from vlmgym.eval.episodes import episode_statistics
from vlmgym.eval.metrics import evaluate_policies


def record(sample: int, reward: float, calls: list[bool]) -> dict:
    return {"id": f"s{sample}", "policy": "grpo", "env": "digits", "answer": "1, 2", "reward": reward,
            "reward_components": {}, "format_ok": True, "parsed": [1, 2], "truth": {"task": "sort", "digits": [1, 2]},
            "episode_turns": len(calls) + 1, "tool_calls": [{"ok": ok} for ok in calls]}


RECORDS = [record(0, 1.0, []), record(1, 0.0, [True]), record(2, 0.5, [False, True]), record(3, 1.0, [True])]


def test_figures_by_hand():
    stats = {name: s.point() for name, s in episode_statistics(RECORDS).items()}
    assert stats["episode_turns"] == 2.0
    assert stats["tool_calls_per_episode"] == pytest.approx(1.0)
    assert stats["tool_call_valid_rate"] == pytest.approx(3 / 4)
    assert stats["mean_reward_turns_1"] == 1.0 and stats["mean_reward_turns_2"] == pytest.approx(0.5)
    assert stats["mean_reward_turns_3"] == 0.5


def test_one_turn_records_have_none_and_policies_compare_on_what_they_share():
    one_turn = [{k: v for k, v in r.items() if k not in ("episode_turns", "tool_calls")} for r in RECORDS]
    assert episode_statistics(one_turn) == {}
    out = evaluate_policies("digits", {"grpo": RECORDS, "sft": [record(i, 0.0, []) for i in range(4)]},
                            n_resamples=200)
    assert out["grpo"]["episode_turns"] == 2.0 and out["sft"]["episode_turns"] == 1.0
    assert out["grpo_minus_sft"]["tool_calls_per_episode"] == pytest.approx(1.0)
    assert "mean_reward_turns_2" not in out["grpo_minus_sft"]  # sft never took two turns


def test_the_gallery_shows_each_turn_and_draws_the_zoom_box():
    from PIL import Image

    from vlmgym.eval.episode_report import BOX_COLOUR, episode_html, zoom_image

    image = Image.new("RGB", (200, 100), (255, 255, 255))
    drawn = zoom_image(image, [0, 0, 500, 500])
    assert drawn.getpixel((0, 20)) == BOX_COLOUR and drawn.getpixel((99, 20)) == BOX_COLOUR
    assert drawn.getpixel((50, 20)) == (255, 255, 255) and drawn.getpixel((150, 80)) == (255, 255, 255)
    episode = {**RECORDS[2], "turns": ["<tool_call>bad</tool_call>", "<tool_call>zoom</tool_call>", "1, 2"],
               "tool_calls": [{"ok": False, "error": "zoom: x2 (-5) must be between 0 and 1000"},
                              {"ok": True, "box": [0, 0, 500, 500]}]}
    shown = []
    out = episode_html(episode, image, lambda picture: shown.append(picture) or "data:x")
    assert "turn 1: refused: zoom: x2 (-5) must be between 0 and 1000" in out and "turn 2: ran" in out
    assert "turn 3: the answer" in out and out.count("<img") == 1 and len(shown) == 1
    assert episode_html(RECORDS[0] | {"turns": ["1, 2"]}, image, str) == ""
