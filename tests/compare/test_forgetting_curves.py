"""A forgetting study's numbers: the change read along a curve, the matched gains and the paired differences there,
the KL-forgetting correlation with its intervals, the sweep's point names, and its settings' errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from vlmgym.compare.forgetting import curves
from vlmgym.compare.forgetting.layout import sweep
from vlmgym.compare.forgetting.settings import check
from vlmgym.params import ParamsError
from vlmgym.stats.seed_interval import seed_t_interval


def test_the_change_is_read_along_the_curve_sorted_by_gain_and_not_beyond_it():
    curve = [(0.0, 0.0), (0.4, -0.2), (0.2, -0.05)]  # points in sweep order, not gain order
    assert curves.along(curve, 0.3) == pytest.approx(-0.125)
    assert curves.along(curve, 0.1) == pytest.approx(-0.025)
    assert math.isnan(curves.along(curve, 0.5))


def test_matched_gains_are_those_every_seeds_curve_of_every_method_reaches():
    by_method = {"sft": [[(0, 0), (0.3, -0.3)], [(0, 0), (0.6, -0.2)]],
                 "grpo": [[(0, 0), (0.9, -0.1)], [(0, 0), (0.45, 0.0)]]}
    assert curves.matched_gains(by_method) == pytest.approx([0.1, 0.2, 0.3])
    rows = curves.at_matched_gain(by_method, "sft", 0.95)
    top = rows[-1]  # at gain 0.3: sft -0.3 and -0.1, grpo -1/30 and 0
    assert top["sft"]["values"] == pytest.approx([-0.3, -0.1])
    assert top["grpo"]["values"] == pytest.approx([-1 / 30, 0.0])
    paired = seed_t_interval([-1 / 30 + 0.3, 0.1], 0.95)
    assert [top["grpo_minus_sft"][k] for k in ("mean", "ci_low", "ci_high")] == pytest.approx(
        [paired.estimate, paired.low, paired.high])


def test_no_matched_gain_when_a_curve_gains_nothing():
    by_method = {"sft": [[(0, 0), (-0.1, -0.3)]], "grpo": [[(0, 0), (0.2, 0.0)]]}
    assert curves.matched_gains(by_method) == [] and curves.at_matched_gain(by_method, "sft", 0.95) == []


def test_kl_predicts_pools_every_run_and_intervals_each_seeds_own_r():
    kl = [[0.1, 0.2, 0.4, 0.8], [0.05, 0.3, 0.5, 0.6]]
    forgetting = [[0.01, 0.03, 0.05, 0.09], [0.0, 0.04, 0.04, 0.08]]
    figures = curves.kl_predicts(kl, forgetting, 0.95)
    assert figures["runs"] == 8 and figures["pooled_r"] > 0.9
    assert figures["pooled_ci_low"] < figures["pooled_r"] < figures["pooled_ci_high"] <= 1
    assert len(figures["per_seed_r"]["values"]) == 2 and figures["slope"] > 0
    assert math.isnan(curves.pearson([1, 1, 1], [1, 2, 3]))  # no spread: no correlation to speak of


def test_a_sweep_names_each_point_by_method_steps_and_rate():
    assert sweep({"sft": [10, 20], "grpo": [5]}, {}) == {
        "sft_10": {"method": "sft", "steps": 10}, "sft_20": {"method": "sft", "steps": 20},
        "grpo_5": {"method": "grpo", "steps": 5}}
    assert list(sweep({"sft": [10]}, {"sft": [1e-3, 3e-3]})) == ["sft_10_lr1", "sft_10_lr2"]
    assert sweep({"sft": [10]}, {"sft": [1e-3, 3e-3]})["sft_10_lr2"]["optimizer"] == {"lr": 3e-3}


def _raw(point=None, **study):
    return {"study": {"base_params": "pipeline.yaml", "env": "several", "seeds": [1, 2], "select": "last",
                      "points": ["sft_10"], **study},
            "generalist": {}, "new_skill": {"env": "part", "settings": {}},
            "point": point or {"sft_10": {"method": "sft", "steps": 10}}}


@pytest.mark.parametrize(("change", "message"), [
    ({"points": ["sft_10", "grpo_5"]}, "point: its names"),
    ({"points": ["generalist"], "point": {"generalist": {"method": "sft"}}}, "names a folder of every seed's runs"),
    ({"seeds": [1, 1]}, "study.seeds"),
    ({"select": "best"}, "study.select"),
])
def test_settings_errors_name_the_key(change, message):
    with pytest.raises(ParamsError, match=message):
        check(_raw(**change), Path("studies/x/params.yaml"))


def test_a_point_needs_a_method():
    raw = _raw()
    raw["point"]["sft_10"]["method"] = "adam"
    with pytest.raises(ParamsError, match=r"point\.sft_10\.method: expected one of sft, grpo"):
        check(raw, Path("studies/x/params.yaml"))
