"""ovd end to end: synthetic scenes and a COCO-layout folder -> raw layout -> shards -> the env; its prompt,
truth, ideal answer, records and metrics through the shared evaluation."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image
from shard_helpers import build_shards

from vlmgym import envs
from vlmgym.envs.nlvr2.data import COLOURS
from vlmgym.envs.ovd import OvdEnv
from vlmgym.envs.ovd import data as ovd_data
from vlmgym.envs.ovd.scene import CATEGORIES, category
from vlmgym.eval.metrics import evaluate
from vlmgym.eval.records import rollout_record
from vlmgym.params import DataParams


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    params = DataParams(source="synthetic", seed=2, train_images=6, test_images=8, ood_images=0, image_width=128,
                        image_height=96)
    return build_shards(tmp_path_factory.mktemp("ovd"), params, "ovd")


def test_registered_and_its_recipe():
    assert envs.env_class("ovd") is OvdEnv and "ovd" in envs.names()
    assert OvdEnv.recipe["train"]["max_new_tokens"] >= 96  # room for several boxes


def test_generated_questions_name_shown_and_absent_categories():
    settings = ovd_data.OvdDataParams()
    for split in ("train", "test", "test_ood"):
        samples = ovd_data.generate_split(5, split, 40, 256, 192, settings)
        assert all((7 <= len(s.scene) <= 9) == (split == "test_ood") for s in samples)
        assert samples == ovd_data.generate_split(5, split, 40, 256, 192, settings)  # deterministic
        for sample in samples:
            shown = {category(o) for o in sample.scene}
            named = set(sample.categories)
            assert len(sample.categories) == settings.named and named <= set(CATEGORIES)
            assert named & shown and named - shown  # something to find and something absent
            assert [label for label, _ in sample.objects] == [category(o) for o in sorted(
                (o for o in sample.scene if category(o) in named), key=lambda o: (o.y, o.x))]


def test_env_serves_the_scenes_from_shards(shards):
    params, shards_dir, manifest = shards
    assert manifest["splits"]["test"]["kept"] == 8 and manifest["splits"]["test"]["skipped"] == {}
    env = envs.make("ovd", shards_dir=str(shards_dir), split="test")
    samples = ovd_data.generate_split(params.seed, "test", 8, params.image_width, params.image_height)
    for idx, sample in enumerate(samples):
        state, obs = env.reset(idx)
        assert state.meta["categories"] == list(sample.categories)
        assert ", ".join(sample.categories) in obs["messages"][0]["content"][-1]["text"]
        image = obs["images"][0]
        for item, (label, _) in zip(state.meta["boxes"], sample.objects, strict=True):
            assert item["label"] == label
            x1, y1, x2, y2 = item["bbox_2d"]  # inside the box (60% down: a triangle too) its colour shows
            centre = ((x1 + x2) / 2000 * image.width, (y1 + 0.6 * (y2 - y1)) / 1000 * image.height)
            pixel = np.array(image.getpixel((int(centre[0]), int(centre[1]))), dtype=int)
            assert np.abs(pixel - COLOURS[label.split()[0]]).max() < 60
        assert env.step_text(state, env.sft_target(state.meta))[2] == 1.0
        assert env.perception_labels(state.meta)  # rec's scene column reaches the warm-up


def _coco_fixture(root):
    """A tiny COCO layout: annotations/instances_{train,val}2017.json and the images in {train,val}2017/."""
    categories = [{"id": 1, "name": "person"}, {"id": 2, "name": "traffic light"}, {"id": 3, "name": "dog"},
                  {"id": 5, "name": "cat"}, {"id": 7, "name": "kite"}]
    for name, count in (("train2017", 3), ("val2017", 4)):
        (root / name).mkdir(parents=True)
        images, annotations = [], []
        for i in range(count):
            image_id = 100 + i
            Image.new("RGB", (64, 48), (10 * i, 100, 200)).save(root / name / f"{image_id:012d}.jpg")
            images.append({"id": image_id, "file_name": f"{image_id:012d}.jpg", "width": 64, "height": 48})
            if i == 1:
                continue  # no boxes: skipped
            annotations += [
                {"id": 10 * image_id + 1, "image_id": image_id, "category_id": 1, "bbox": [4, 6, 20, 30],
                 "iscrowd": 0, "area": 600},
                {"id": 10 * image_id + 2, "image_id": image_id, "category_id": 2, "bbox": [40, 2, 30, 10],
                 "iscrowd": 0, "area": 300},  # runs past the right edge: clipped to 64
                {"id": 10 * image_id + 3, "image_id": image_id, "category_id": 3, "bbox": [0, 0, 64, 48],
                 "iscrowd": 1, "area": 3072},  # a crowd: dog is named neither way
            ]
        (root / "annotations").mkdir(exist_ok=True)
        (root / "annotations" / f"instances_{name}.json").write_text(json.dumps(
            {"images": images, "annotations": annotations, "categories": categories}))


def test_coco_layout_through_the_shards(tmp_path):
    _coco_fixture(tmp_path / "coco")
    params = DataParams(source="hub", seed=1, train_images=5, test_images=5, hub_repo=str(tmp_path / "coco"))
    params, shards_dir, manifest = build_shards(tmp_path / "run", params, "ovd")
    assert manifest["splits"]["test"]["kept"] == 3 and manifest["splits"]["train"]["kept"] == 2
    counts = OvdEnv.download_hub(params, tmp_path / "again")
    assert counts == {"train_samples": 2, "train_skipped_no_boxes": 1, "test_samples": 3, "test_skipped_no_boxes": 1}
    assert (tmp_path / "again" / "test.csv").read_bytes() == (tmp_path / "run" / "raw" / "test.csv").read_bytes()
    env = envs.make("ovd", shards_dir=str(shards_dir), split="test")
    for idx in range(len(env)):
        state, _ = env.reset(idx)
        named = state.meta["categories"]
        assert len(named) == 4 and "dog" not in named and {"cat", "kite"} & set(named)
        expected = [b for b in ({"label": "person", "bbox_2d": [63, 125, 375, 750]},
                                {"label": "traffic light", "bbox_2d": [625, 42, 1000, 250]}) if b["label"] in named]
        assert sorted(state.meta["boxes"], key=lambda b: b["label"]) == expected
        assert env.step_text(state, env.ideal_answer(state.meta))[2] == 1.0
    with pytest.raises(FileNotFoundError, match="COCO-layout"):
        OvdEnv.download_hub(replace(params, hub_repo=str(tmp_path / "nothing")), tmp_path / "raw2")


def test_records_and_metrics_through_the_shared_evaluation():
    env = OvdEnv(samples=OvdEnv.generate(12, seed=4, split="test"))
    policies = {"ideal": [], "half": [], "junk": []}
    for idx in range(len(env)):
        state, _ = env.reset(idx)
        ideal = env.ideal_answer(state.meta)
        half = json.dumps(json.loads(ideal)[:1])
        for policy, text in (("ideal", ideal), ("half", half), ("junk", "lorem ipsum")):
            reward, info = env.step_text(state, text)[2::2]
            record = rollout_record(OvdEnv, state.key, text, reward, info, state.meta, policy=policy)
            policies[policy].append(json.loads(json.dumps(record)))
    ideal = evaluate(OvdEnv, policies["ideal"], n_resamples=100)
    assert ideal["map"] == ideal["ap50"] == ideal["mean_f1"] == ideal["exact"] == ideal["mean_reward"] == 1.0
    assert ideal["format_valid_rate"] == 1.0
    half = evaluate(OvdEnv, policies["half"], n_resamples=100)
    assert 0 < half["map_ci_low"] <= half["map"] <= half["map_ci_high"] < 1 and half["exact"] < 1
    assert half["mean_f1"] == pytest.approx(half["mean_reward"])
    junk = evaluate(OvdEnv, policies["junk"], n_resamples=100)
    assert junk["map"] == junk["ap50"] == junk["mean_f1"] == junk["format_valid_rate"] == 0.0
    assert all(r["pred_boxes"] is None and OvdEnv.outcome_text(r) == "no list" for r in policies["junk"])
    record = policies["half"][0]
    assert OvdEnv.solved(record) is (len(record["truth"]["boxes"]) == 1)
    assert "found" in OvdEnv.outcome_text(record) and "->" in OvdEnv.truth_text(record["truth"])
    drawn = OvdEnv.gallery_images([Image.new("RGB", (256, 192), "white")], {"ideal": policies["ideal"][0],
                                                                           "junk": None})
    assert drawn[0].size[0] == 192 and "<h2>Detections</h2>" in OvdEnv.report_html(policies, None)
