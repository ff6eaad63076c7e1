"""nlvr2 end to end: synthetic raw layout -> download/shard libraries -> webdataset shards -> make("nlvr2")."""

from __future__ import annotations

import numpy as np
import pytest
from shard_helpers import build_shards

from vlmgym import envs
from vlmgym.envs.nlvr2 import data as nlvr2
from vlmgym.params import DataParams


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    params = DataParams(source="synthetic", seed=2, train_images=6, test_images=10, image_width=128, image_height=96)
    return build_shards(tmp_path_factory.mktemp("pipeline"), params, "nlvr2")


def test_env_serves_the_generated_pairs_from_shards(shards):
    params, shards_dir, manifest = shards
    assert manifest["splits"]["test"]["kept"] == 10 and manifest["splits"]["train"]["kept"] == 6
    env = envs.make("nlvr2", shards_dir=str(shards_dir), split="test")
    pairs = nlvr2.generate_split(params.seed, "test", 10, params.image_width, params.image_height,
                                 **nlvr2.NLVR2DataParams().knobs())  # what build_raw wrote: the env's defaults
    assert len(env) == len(pairs)
    for idx, pair in enumerate(pairs):
        state, obs = env.reset(idx)
        assert state.meta["id"] == pair.id and state.truth is pair.label
        assert pair.sentence in obs["messages"][0]["content"][-1]["text"]
        # images arrive in (left, right) order: each described shape's colour is at its centre
        assert len(obs["images"]) == 2
        for image, scene in zip(obs["images"], (pair.left, pair.right)):
            for obj in scene:
                pixel = np.array(image.getpixel((round(obj.x), round(obj.y))), dtype=int)
                assert np.abs(pixel - nlvr2.COLOURS[obj.colour]).max() < 40
        # the generator's trace reaches the SFT target through the shards, before the verdict
        right = env.sft_target(state.meta)
        assert right == f"{pair.trace} {pair.label}"
        wrong = f"{pair.trace} {not pair.label}"
        assert env.step_text(state, right)[2] == 1.0 and env.step_text(state, wrong)[2] == 0.0


def test_registered_under_its_name():
    from vlmgym.envs.nlvr2 import NLVR2Env

    assert envs.env_class("nlvr2") is NLVR2Env and NLVR2Env.name == "nlvr2"
