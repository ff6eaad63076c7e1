"""The engine split over several devices (one decode loop per CPU core) samples what one device samples."""

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from vlmgym.rollout.engine import RolloutEngine, slice_prompts
from vlmgym.rollout.sampling import SamplingSettings

pytestmark = pytest.mark.slow


def test_split_over_two_devices_equals_one(tiny_model: Any, run_on_cpu_devices):
    here = Path(__file__).parent
    stdout = run_on_cpu_devices(2, [here / "multi_device_run.py", tiny_model.folder], cwd=here)
    report = json.loads(stdout.strip().splitlines()[-1])
    for name in ("sampled", "greedy"):
        out = report[name]
        assert out["devices_used"] == ["cpu:0", "cpu:1"], out  # each device ran a part
        assert out["tokens_equal"] and out["mask_equal"] and out["finish_equal"] and out["texts_equal"], out
        assert out["again_equal"] and out["new_traces_on_second_call"] == 0, out
        assert out["logprob_diff"] < 1e-5 and out["sample_logprob_diff"] < 1e-5, out
    assert report["sampled"]["ended_by_eos"] > 0


def test_slice_prompts_keeps_rows_and_their_images(tiny_model: Any, make_obs):
    obs = [make_obs(0), make_obs(1, num_images=2), make_obs(2), make_obs(3, num_images=3)]
    engine = RolloutEngine(tiny_model.cfg, tiny_model.processor, SamplingSettings(max_new_tokens=4))
    inputs = engine.prepare(obs)
    for start, stop in ((0, 1), (1, 3), (3, 4), (0, 4)):
        part = slice_prompts(inputs, start, stop, tiny_model.cfg)
        alone = engine.prepare(obs[start:stop])
        np.testing.assert_array_equal(part["pixel_values"], alone["pixel_values"])
        np.testing.assert_array_equal(part["image_grid_thw"], alone["image_grid_thw"])
        for row in range(stop - start):
            kept, own = part["attention_mask"][row] == 1, alone["attention_mask"][row] == 1
            np.testing.assert_array_equal(part["input_ids"][row][kept], alone["input_ids"][row][own])
            np.testing.assert_array_equal(part["position_ids"][:, row][:, kept], alone["position_ids"][:, row][:, own])
        assert part["input_ids"].shape == (stop - start, inputs["input_ids"].shape[1])


def test_one_device_list_runs_in_place(tiny_model: Any, make_obs):
    settings = SamplingSettings(max_new_tokens=6, temperature=1.0)
    obs = [make_obs(0), make_obs(2)]
    plain = RolloutEngine(tiny_model.cfg, tiny_model.processor, settings)
    pinned = RolloutEngine(tiny_model.cfg, tiny_model.processor, settings, devices=jax.devices()[:1])
    a = plain.generate(tiny_model.params, obs, 2, jax.random.key(1))
    b = pinned.generate(tiny_model.params, obs, 2, jax.random.key(1))
    np.testing.assert_array_equal(a.completion_ids, b.completion_ids)
