"""The mixture env: its weighted index space (shares, determinism, resumability), delegation to the sub-envs, its
params' validation, its data layout (per-env raw and shards), the tokenizer corpus and the per-env figures."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from adversarial import JUNK, wordings

from vlmgym import envs
from vlmgym.data.download import build_raw_parts
from vlmgym.data.shard_writer import manifest_metrics, shard_parts
from vlmgym.envs.base import PART_KEY, part_metric
from vlmgym.envs.digits import DigitsEnv
from vlmgym.envs.message_decoding import MessageDecodingEnv
from vlmgym.envs.mixture import MixtureEnv, MixtureParams, slot_counts, slot_table
from vlmgym.params import DataParams, EnvParams, ParamsError, ShardParams, from_dict, render_yaml
from vlmgym.rl.loop import DataOrder
from vlmgym.rl.trainer_parts import part_figures
from vlmgym.rl.validation import part_means

NAMES = ("digits", "message_decoding")


@pytest.fixture(scope="module")
def parts():
    return {"digits": DigitsEnv(samples=DigitsEnv.generate(12, seed=0)),
            "message_decoding": MessageDecodingEnv(samples=MessageDecodingEnv.generate(5, seed=0))}


def _mix(parts, weights=(1.0, 1.0), seed=0, weighted=True):
    return MixtureEnv(dict(parts), params=MixtureParams(envs=dict(zip(NAMES, weights)), seed=seed), weighted=weighted)


# --- the weighted index space ------------------------------------------------------------------------------


@pytest.mark.parametrize("weights", [(1.0, 1.0), (3.0, 1.0), (1.0, 4.0), (0.2, 0.7)])
def test_slots_follow_the_weights_and_cover_every_sample(parts, weights):
    mix = _mix(parts, weights)
    counts = Counter(mix.locate(i)[0] for i in range(len(mix)))
    share = counts["digits"] / len(mix)
    assert share == pytest.approx(weights[0] / sum(weights), abs=1 / len(mix))
    for name, env in parts.items():  # every sample of every env is drawn at least once per epoch
        assert {mix.locate(i)[1] for i in range(len(mix)) if mix.locate(i)[0] == name} == set(range(len(env)))


def test_batches_drawn_by_the_trainers_data_order_follow_the_weights(parts):
    mix = _mix(parts, (3.0, 1.0))
    order = DataOrder(len(mix), seed=7)
    drawn = Counter(mix.locate(i)[0] for _ in range(500) for i in order.take(8))
    assert drawn["digits"] / 4000 == pytest.approx(0.75, abs=0.02)


def test_slot_counts_round_by_largest_remainder_and_cap():
    assert slot_counts([10, 10], [1.0, 2.0]) == [10, 20]
    assert slot_counts([10, 7], [3.0, 1.0]) == [21, 7]  # 7 needs 28 slots in all: 21 + 7
    counts = slot_counts([5, 5, 5], [1.0, 1.0, 1.0], max_slots=10)
    assert sum(counts) == 10 and sorted(counts) == [3, 3, 4]
    assert slot_counts([100, 100], [1.0, 1e-9], max_slots=1000) == [999, 1]  # every env keeps a slot


def test_the_map_is_deterministic_by_seed(parts):
    a, b, c = _mix(parts, seed=0), _mix(parts, seed=0), _mix(parts, seed=1)
    walk = [a.locate(i) for i in range(len(a))]
    assert walk == [b.locate(i) for i in range(len(b))]
    assert walk != [c.locate(i) for i in range(len(c))]
    envs_, local = slot_table([12, 5], [1.0, 1.0], seed=0)
    assert np.array_equal(envs_, slot_table([12, 5], [1.0, 1.0], seed=0)[0])
    assert sorted(local[envs_ == 1][:5]) == list(range(5))


def test_other_splits_are_the_concatenation(parts):
    mix = _mix(parts, (5.0, 1.0), weighted=False)
    assert len(mix) == 17
    assert [mix.locate(i) for i in (0, 11, 12, 16)] == [("digits", 0), ("digits", 11), ("message_decoding", 0),
                                                       ("message_decoding", 4)]


# --- delegation ----------------------------------------------------------------------------------------------


def test_reset_step_and_sft_target_go_to_the_sub_env(parts):
    mix = _mix(parts)
    seen = set()
    for idx in range(len(mix)):
        name, local = mix.locate(idx)
        state, obs = mix.reset(idx)
        inner_state, inner_obs = parts[name].reset(local)
        assert state.meta == {**inner_state.meta, PART_KEY: name} and state.key == inner_state.key
        assert obs["messages"] == inner_obs["messages"]
        target = mix.sft_target(state.meta)
        assert target == parts[name].sft_target(inner_state.meta)
        _, _, reward, done, info = mix.step_text(state, target)
        assert reward == parts[name].step_text(inner_state, target)[2] == 1.0 and done and info[PART_KEY] == name
        assert mix.step_text(state, "\x00 nonsense")[2] < 1.0
        seen.add(name)
    assert seen == set(NAMES)


def test_junk_and_wordings_of_the_right_answer_score_zero_on_every_sub_env(parts):
    """The mixture pays what its sub-env pays: nothing for the shared junk, for another sample's answer, or for the
    right answer negated, hedged or beside a wrong one."""
    mix = _mix(parts)
    states = [mix.reset(i)[0] for i in range(len(mix))]
    targets = [mix.sft_target(state.meta) for state in states]
    assert {mix.part_of(state.meta) for state in states} == set(NAMES)
    for state, right in zip(states, targets):
        wrong = next(t for t in targets if t != right and mix.score(state, t)[0] == 0.0)
        for text in [*JUNK, *wordings(right, wrong)]:
            reward, info = mix.score(state, text)
            assert reward == 0.0 and not info["format_ok"], (mix.part_of(state.meta), right, text[:80])
        assert mix.score(state, right)[0] == 1.0  # the zeros above are the wording's doing


def test_progress_reaches_every_sub_env(parts):
    mix = _mix(parts)
    mix.set_progress(0.5)
    assert mix.progress == 0.5 and all(env.progress == 0.5 for env in parts.values())
    mix.set_progress(0.0)


def test_a_sub_env_meta_key_that_collides_is_an_error(parts):
    samples = DigitsEnv.generate(2, seed=0)
    clash = [replace(s, meta={**s.meta, PART_KEY: "x"}) for s in samples]
    mix = MixtureEnv({"digits": DigitsEnv(samples=clash), "message_decoding": parts["message_decoding"]},
                     params=MixtureParams(envs={"digits": 1.0, "message_decoding": 1.0}), weighted=False)
    with pytest.raises(ValueError, match=PART_KEY):
        mix.reset(0)
    with pytest.raises(ValueError, match="no sub-env"):
        mix.sft_target({"id": "x"})


# --- params ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, message", [
    ({"envs": {"digits": 1.0}}, "at least 2 envs"),
    ({"envs": {"digits": 1.0, "mixture": 1.0}}, "cannot contain a mixture"),
    ({"envs": {"digits": 1.0, "nope": 1.0}}, r"envs\.nope: unknown env"),
    ({"envs": {"digits": 1.0, "rec": 0.0}}, r"envs\.rec: weight must be a positive"),
    ({"envs": {"digits": 1.0, "rec": -2}}, r"envs\.rec: weight must be a positive"),
    ({"envs": {"digits": 1.0, "rec": float("inf")}}, r"envs\.rec: value inf is not a finite number"),
    ({"envs": {"digits": "heavy", "rec": 1.0}}, r"env\.mixture\.envs\.digits: expected a number"),
    ({"envs": ["digits", "rec"]}, r"env\.mixture\.envs: expected a mapping"),
    ({"weights": {"digits": 1.0}}, r"env\.mixture\.weights: unknown key"),
])
def test_bad_params_name_the_key(bad, message):
    with pytest.raises(ParamsError, match=message) as err:
        from_dict(EnvParams, {"name": "mixture", "mixture": bad}, where="params.yaml: env")
    assert str(err.value).startswith("params.yaml: env.mixture")


def test_params_read_and_render():
    section = from_dict(EnvParams, {"name": "mixture", "mixture": {"envs": {"rec": 2, "digits": 1}},
                                    "digits": {"format_weight": 0.3}}, where="p: env")
    assert envs.parts(section) == ["digits", "rec"] and envs.has_parts(section)  # name order, always
    assert section.settings().envs == {"rec": 2.0, "digits": 1.0}
    assert envs.part_params(section, "digits").settings().format_weight == 0.3
    # a sub-env on its own under the mixture's recipe: it runs the mixture's settings, not a recipe of its own
    recipe = from_dict(EnvParams, {"name": "mixture", "recipe": "mixture"}, where="p: env")
    assert envs.part_params(recipe, "digits").recipe == "" and envs.part_params(recipe, "digits").name == "digits"
    assert not envs.has_parts(EnvParams()) and envs.parts(EnvParams()) == ["geospot"]
    assert envs.parts(EnvParams(name="mixture")) == list(NAMES)  # the default mixture
    text = render_yaml({"env": section})
    assert "  mixture:  # mixture: the sub-envs" in text and "envs: {digits: 1.0, rec: 2.0}" in text


def test_corpus_adds_every_sub_env_after_the_fixed_ones():
    base = envs.corpus()
    both = envs.corpus(list(NAMES))
    assert both[: len(base)] == base
    assert both[len(base):] == DigitsEnv.corpus() + MessageDecodingEnv.corpus()
    assert envs.corpus("digits") == base + DigitsEnv.corpus()  # one env: as before
    assert envs.corpus(["geospot", "digits"]) == envs.corpus("digits")  # a fixed env's texts are not repeated


# --- data: per-env layouts, and the mixture served from them ----------------------------------------------------


def test_download_and_shard_write_each_env_beside_the_others(tmp_path):
    data = DataParams(seed=1, train_images=8, test_images=4, ood_images=2, image_width=96, image_height=64,
                      raw_dir=str(tmp_path / "raw"))
    stats = build_raw_parts(data, {name: envs.env_class(name) for name in NAMES})
    assert set(stats["parts"]) == set(NAMES) and stats["parts"]["digits"]["test_rows"] == 4
    assert json.loads((tmp_path / "raw" / "parts.json").read_text()) == {"parts": list(NAMES)}
    schemas = {name: envs.env_class(name).schema for name in NAMES}
    manifest = shard_parts(tmp_path / "raw", tmp_path / "shards", schemas, ShardParams(val_samples=2))
    for name in NAMES:
        part = json.loads((tmp_path / "shards" / name / "manifest.json").read_text())
        assert part["dataset"] == name and part["splits"]["test_ood"]["kept"] == 2
        assert part == manifest["parts"][name]
    assert manifest_metrics(manifest)["digits/train.kept"] == 6
    section = EnvParams(name="mixture")
    assert envs.split_dirs(section, tmp_path / "shards", "val") == [tmp_path / "shards" / n / "val" for n in NAMES]
    train = envs.from_params(section, shards_dir=str(tmp_path / "shards"), split="train")
    assert isinstance(train, MixtureEnv) and train.weighted and len(train) == 12
    test = envs.from_params(section, shards_dir=str(tmp_path / "shards"), split="test", progress=1.0)
    assert not test.weighted and len(test) == 8 and test.parts["digits"].progress == 1.0


# --- per-env figures ----------------------------------------------------------------------------------------------


def test_step_figures_per_sub_env_only_for_answers_that_name_one():
    infos = [{PART_KEY: "a", "reward_components": {"format": 0.1}}, {PART_KEY: "b", "reward_components": {"x": 1.0}},
             {PART_KEY: "a", "reward_components": {"format": 0.0}}, {PART_KEY: "a"}]
    out = part_figures(infos, np.array([1.0, 0.0, 0.5, 0.0]), np.array([1.0, 0.2, 0.5, 0.3]))
    assert out[part_metric("a", "share")] == 0.75 and out[part_metric("b", "share")] == 0.25
    assert out["env/a/reward_mean"] == pytest.approx(0.5) and out["env/b/reward_mean"] == 0.0
    assert out["env/a/final_reward_mean"] == pytest.approx(0.6) and out["env/b/final_reward_mean"] == 0.2
    assert out["env/a/reward/format"] == pytest.approx(0.05) and out["env/b/reward/x"] == 1.0
    assert "env/a/reward/x" not in out
    assert part_figures([{"reward_components": {"f": 1.0}}], np.ones(1), np.ones(1)) == {}  # one env: none
    assert part_means("val/reward_greedy", [1.0, 0.0, 0.5], ["a", "b", "a"]) == {
        "env/a/val/reward_greedy": 0.75, "env/b/val/reward_greedy": 0.0}
    assert part_means("val/reward_greedy", [1.0], [None]) == {}
