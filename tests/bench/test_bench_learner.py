"""`vlmgym bench learner`: the per-copy layout it builds for the compiled 4B counts, and its arguments."""

import numpy as np
import pytest

from vlmgym.bench.learner import _per_copy_inputs, parse_args


def test_per_copy_inputs_repeat_each_prompt_with_its_own_images():
    grids = np.array([[1, 2, 2], [1, 2, 4]])  # 4 and 8 patches
    inputs = {"input_ids": np.array([[1, 2], [3, 4]]), "attention_mask": np.array([[0, 1], [1, 1]]),
              "position_ids": np.arange(12).reshape(3, 2, 2), "pixel_values": np.arange(12)[:, None],
              "image_grid_thw": grids}
    out = _per_copy_inputs(inputs, 3)
    assert out["input_ids"].tolist() == [[1, 2]] * 3 + [[3, 4]] * 3
    assert out["attention_mask"].tolist() == [[0, 1]] * 3 + [[1, 1]] * 3
    assert out["position_ids"].shape == (3, 6, 2) and (out["position_ids"][:, 3] == inputs["position_ids"][:, 1]).all()
    assert out["pixel_values"][:, 0].tolist() == [0, 1, 2, 3] * 3 + list(range(4, 12)) * 3
    assert out["image_grid_thw"].tolist() == [[1, 2, 2]] * 3 + [[1, 2, 4]] * 3


def test_arguments_must_be_positive():
    with pytest.raises(SystemExit):
        parse_args(["--group", "0"])
    assert parse_args([]).group == 8
