"""The training stages' curves as PNGs (vlmgym.eval.curve.write_training_curve_pngs): drawn from a curve file, one
panel per kind of figure, each figure the file holds named in its panel's legend."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from vlmgym.eval.curve import CURVES_PNG, centred_mean, training_curves_figure, write_training_curve_pngs
from vlmgym.tracking.step_curve import read_curve, write_curve


def grpo_curve(steps: int = 30) -> dict[int, dict[str, float]]:
    """A GRPO run's figures as the train stage writes them: every step's, validation every 10 steps from step 0."""
    curve: dict[int, dict[str, float]] = {}
    for step in range(steps + 1):
        figures = {}
        if step:
            figures = {"loss": 0.01 * np.sin(step), "reward_mean": 0.2 + 0.01 * step, "final_reward_mean": 0.3,
                       "approx_kl_behaviour": 1e-9 * step, "kl_sampler_learner": -2e-9, "entropy": 0.4 - 0.001 * step,
                       "learning_rate": 1e-5 * step, "grad_norm": 0.5, "reward/format": 1.0}
        if step % 10 == 0:
            figures.update({"val/reward_greedy": 0.3 + 0.001 * step, "val/reward_sampled": 0.28})
        curve[step] = figures
    return curve


def sft_curve() -> dict[int, dict[str, float]]:
    """An SFT run's figures: the loss every step, the validation loss and rewards every 4 steps."""
    curve = {step: {"loss": 7.0 / step, "tokens": 600.0} for step in range(1, 13)}
    for step in (0, 4, 8, 12):
        curve.setdefault(step, {}).update({"val/loss": 7.0 / (step + 1), "val/reward_greedy": step / 20,
                                           "val/reward_sampled": step / 25})
    return curve


def drawn(figure) -> dict[str, list[str]]:
    """{panel title: the series its legend names} of a figure's visible panels."""
    return {axis.get_title(): [text.get_text() for text in axis.get_legend().get_texts()]
            for axis in figure.axes if axis.get_visible()}


def test_the_train_curves_png_shows_loss_reward_validation_kl_and_entropy(tmp_path):
    curve_file = write_curve(tmp_path / "train.jsonl", grpo_curve())
    written = write_training_curve_pngs({"train": curve_file}, tmp_path)
    png = tmp_path / CURVES_PNG.format(stage="train")
    assert written == {"train": png}
    image = np.asarray(Image.open(png).convert("L"))
    assert image.shape[0] > 400 and image.shape[1] > 1000 and image.std() > 10  # two rows of panels, drawn on
    import matplotlib.pyplot as plt

    figure = training_curves_figure("train", read_curve(curve_file))
    try:
        # the schedule and the norms are left out: a rerun that changes only them draws the same image
        assert drawn(figure) == {
            "Loss": ["loss"],
            "Training reward": ["final_reward_mean", "reward_mean"],
            "Validation reward (val split)": ["val/reward_greedy", "val/reward_sampled"],
            "KL divergence": ["approx_kl_behaviour", "kl_sampler_learner"],
            "Entropy": ["entropy"],
        }
        assert figure.get_suptitle() == "train stage: training curves"
        loss = next(axis for axis in figure.axes if axis.get_title() == "Loss")
        # the steps' own values under their smoothed line, both over every step
        assert [list(line.get_xdata()) for line in loss.get_lines()] == [list(range(1, 31))] * 2
    finally:
        plt.close(figure)


def test_the_sft_curves_png_shows_the_loss_and_validation_it_has(tmp_path):
    curve_file = write_curve(tmp_path / "sft.jsonl", sft_curve())
    assert write_training_curve_pngs({"sft": curve_file}, tmp_path) == {"sft": tmp_path / "reports/curves_sft.png"}
    import matplotlib.pyplot as plt

    figure = training_curves_figure("sft", read_curve(curve_file))
    try:
        assert drawn(figure) == {"Loss": ["loss", "val/loss"],
                                 "Validation reward (val split)": ["val/reward_greedy", "val/reward_sampled"]}
    finally:
        plt.close(figure)


def test_a_series_equal_to_one_drawn_before_it_is_dashed_over_it():
    import matplotlib.pyplot as plt

    # without a curriculum the reward at the final weights is the reward as trained
    figure = training_curves_figure("train", {step: {"final_reward_mean": 0.1 * step, "reward_mean": 0.1 * step}
                                              for step in range(1, 4)})
    try:
        (axis,) = [axis for axis in figure.axes if axis.get_visible()]
        assert drawn(figure) == {"Training reward": ["final_reward_mean", "reward_mean"]}
        assert [line.get_linestyle() for line in axis.get_lines()] == ["-", "--"]
    finally:
        plt.close(figure)


def test_a_run_without_curves_gets_no_png(tmp_path):
    empty = write_curve(tmp_path / "sft.jsonl", {})  # sft.steps: 0
    other = tmp_path / "train.jsonl"
    other.write_text(json.dumps({"step": 1, "metrics": {"tokens": 5.0}}) + "\n")  # none of the panels' figures
    assert write_training_curve_pngs({"sft": empty, "train": other, "absent": tmp_path / "absent.jsonl"},
                                     tmp_path) == {}
    assert not (tmp_path / "reports").exists()


def test_the_same_curve_draws_the_same_bytes(tmp_path):
    # the evaluate stage's outputs are DVC outputs: a rerun on the same curves must not change their hash
    curve_file = write_curve(tmp_path / "train.jsonl", grpo_curve())
    first = write_training_curve_pngs({"train": curve_file}, tmp_path / "a")["train"].read_bytes()
    assert write_training_curve_pngs({"train": curve_file}, tmp_path / "b")["train"].read_bytes() == first


@pytest.mark.parametrize(("values", "half_width", "expected"), [
    ([1.0, 2.0, 3.0, 10.0, 5.0], 2, [1.0, 2.0, 4.2, 6.0, 5.0]),  # as many neighbours each side, fewer at the ends
    ([4.0, 8.0], 0, [4.0, 8.0]),
    ([], 3, []),
])
def test_centred_mean(values, half_width, expected):
    assert centred_mean(values, half_width) == pytest.approx(expected)
