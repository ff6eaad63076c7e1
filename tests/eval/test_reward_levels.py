"""The report's training reward: each reward level's unweighted curve and weight beside the weighted total, read
from the train stage's curve file; and gallery answers that cannot stretch their card."""

from __future__ import annotations

import csv
import re

import pytest

from vlmgym.envs.geospot.env import GeospotEnv
from vlmgym.envs.nlvr2 import NLVR2Env
from vlmgym.eval.curve import component_metric, reward_curves
from vlmgym.eval.outputs import reward_curve_note, write_evaluation
from vlmgym.eval.report import _STYLE, ANSWER_CHARS, answer_note
from vlmgym.stats.plots import (
    RewardCurves,
    best_validation,
    plot_reward_curve_png,
    trailing_mean,
    write_level_curves_csv,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_geospot_declares_its_levels_coarse_to_fine_and_nlvr2_none():
    assert list(GeospotEnv.reward_levels) == ["country", "region", "city", "coords"]
    assert GeospotEnv.reward_levels["city"] == ("k_city", "w_city")
    assert NLVR2Env.reward_levels == {}


@pytest.fixture()
def train_curve(tmp_path):
    """The train stage's curve file: a total falling while the country level rises, as a curriculum shifting
    weight to finer levels makes it; coords never logged; validation at step 0 and every other step, then the
    end."""
    from vlmgym.tracking.step_curve import write_curve

    steps = {step: {"reward_mean": 0.6 - 0.1 * step, component_metric("k_country"): 0.5 + 0.1 * step,
                    component_metric("k_region"): 0.2, component_metric("k_city"): 0.1,
                    component_metric("w_country"): 1.0 - 0.2 * step, component_metric("w_city"): 0.1 * step}
             for step in (1, 2, 3)}
    steps[0] = {}
    for step, greedy in ((0, 0.3), (2, 0.45), (3, 0.4)):
        steps[step].update({"val/reward_greedy": greedy, "val/reward_sampled": greedy - 0.1})
    return write_curve(tmp_path / "metrics/curves/train.jsonl", steps)


def test_reward_curves_hold_each_logged_level_and_weight(train_curve):
    curves = reward_curves(GeospotEnv, train_curve, "reward_mean")
    assert [step for step, _ in curves.total] == [1, 2, 3] and curves.total[0][1] == pytest.approx(0.5)
    assert list(curves.levels) == ["country", "region", "city"]  # in the env's order; coords was never logged
    assert curves.levels["country"][-1] == (3, pytest.approx(0.8))
    assert list(curves.weights) == ["country", "city"]
    assert curves.validation["greedy"] == [(0, 0.3), (2, 0.45), (3, 0.4)]
    assert curves.validation["sampled"][0] == (0, pytest.approx(0.2))
    assert best_validation(curves) == (2, 0.45)
    assert "best greedy one was at step 2 (0.4500)" in reward_curve_note(curves)
    # an env without levels: the total alone, from the same file
    alone = reward_curves(NLVR2Env, train_curve, "reward_mean")
    assert alone.total == curves.total and alone.levels == {} and alone.weights == {}
    assert "level" not in reward_curve_note(alone) and "unweighted" in reward_curve_note(curves)
    # a sub-env's own figures, under its prefix (vlmgym.envs.base.part_metric)
    assert reward_curves(NLVR2Env, train_curve, "reward_mean", prefix="env/nlvr2/").total == []


def test_level_curves_csv_lines_up_steps(tmp_path):
    curves = RewardCurves(total=[(1, 0.5), (2, 0.4)], levels={"country": [(2, 0.7), (1, 0.6)], "city": [(2, 0.1)]},
                          weights={"country": [(1, 0.9), (2, 0.8)]})
    write_level_curves_csv(tmp_path / "levels.csv", curves)
    with open(tmp_path / "levels.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert rows == [{"step": "1", "country": "0.6", "city": "", "country_weight": "0.9"},
                    {"step": "2", "country": "0.7", "city": "0.1", "country_weight": "0.8"}]
    with pytest.raises(ValueError, match="non-finite"):
        write_level_curves_csv(tmp_path / "bad.csv", RewardCurves(levels={"city": [(1, float("inf"))]}))


def test_trailing_mean():
    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert trailing_mean([1.0, 3.0], 1) == [1.0, 3.0]


@pytest.mark.parametrize("steps", [2, 60])  # drawn point by point, and smoothed
def test_reward_png_with_levels_is_wider_than_the_total_alone(tmp_path, steps):
    from PIL import Image

    total = [(s, 0.5 - s / 1000) for s in range(1, steps + 1)]
    plot_reward_curve_png(tmp_path / "total.png", total)
    plot_reward_curve_png(tmp_path / "levels.png", RewardCurves(
        total=total, levels={"country": [(s, 0.6) for s, _ in total], "city": [(s, 0.1) for s, _ in total]},
        weights={"country": [(s, 0.8) for s, _ in total], "city": [(s, 0.2) for s, _ in total]}))
    with Image.open(tmp_path / "total.png") as alone, Image.open(tmp_path / "levels.png") as beside:
        assert alone.format == beside.format == "PNG"
        assert beside.width > 2.5 * alone.width  # three panels: total, levels, weights
    both = RewardCurves(total=total, as_trained=[(s, r - 0.2) for s, r in total])
    plot_reward_curve_png(tmp_path / "both.png", both)
    with Image.open(tmp_path / "both.png") as image, Image.open(tmp_path / "total.png") as alone:
        assert image.width < 1.5 * alone.width  # one panel, two curves
    assert "final weights" in reward_curve_note(both) and "final weights" not in reward_curve_note(RewardCurves(total))


def test_evaluation_writes_the_level_curves_and_explains_them(tmp_path):
    records = [{"id": f"pair{i}", "answer": "True" if i % 2 else "\n" * 64, "pred_label": True if i % 2 else None,
                "truth": {"label": True, "sentence": "Two dogs."}, "reward": float(i % 2), "format_ok": bool(i % 2)}
               for i in range(4)]
    curves = RewardCurves(total=[(1, 0.5), (2, 0.4)], levels={"correct": [(1, 0.5), (2, 0.6)]},
                          validation={"greedy": [(0, 0.25), (2, 0.5)], "sampled": [(2, 0.375)]})
    outputs = write_evaluation("nlvr2", {"grpo": records}, {}, out_root=tmp_path, reward_curve=curves,
                               comparisons=(), n_resamples=20)
    assert outputs.files["train_reward_levels"].read_text() == "step,correct\n1,0.5\n2,0.6\n"
    assert outputs.files["val_reward"].read_text() == "step,greedy,sampled\n0,0.25,\n2,0.5,0.375\n"
    assert outputs.files["train_reward_png"].read_bytes()[:8] == PNG_MAGIC
    page = outputs.files["html"].read_text()
    assert "<h2>Training reward</h2><p>" in page and "each level&#x27;s own score, unweighted" in page
    assert page.count('<div class="note">64 characters, whitespace only</div>') == 2


def test_gallery_answer_boxes_are_bounded():
    box = re.search(r"\.card pre\{([^}]*)\}", _STYLE).group(1)
    assert "max-height" in box and "overflow:auto" in box
    # a card may not stretch to the tallest in its row
    assert "align-items:flex-start" in re.search(r"\.gallery\{([^}]*)\}", _STYLE).group(1)
    assert answer_note("Country: France") == ""
    assert answer_note("") == '<div class="note">empty answer</div>'
    assert answer_note(" \n\n") == '<div class="note">3 characters, whitespace only</div>'
    assert answer_note("x" * (ANSWER_CHARS + 5)) == (
        f'<div class="note">first {ANSWER_CHARS} of {ANSWER_CHARS + 5} characters</div>')
