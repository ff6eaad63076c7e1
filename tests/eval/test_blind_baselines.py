"""The image-blind baselines: the best constant answer (chosen on one split, scored on another), blanked images,
and the evaluate outputs' blind check with its warning, on docs/writing-an-env.md's colour env (a plug-in)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vlmgym.data.shards import Sample
from vlmgym.eval import blind
from vlmgym.eval.outputs import BLIND_HEADING, write_evaluation
from vlmgym.eval.records import rollout_record
from vlmgym.params import ParamsError, RolloutParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
from colour_env import COLOURS, ColourEnv  # noqa: E402


def colour_samples(colours, size=(8, 6)):
    return [Sample(f"s{i}", [Image.new("RGB", size, COLOURS[c])], {"colour": c}) for i, c in enumerate(colours)]


def test_the_constant_is_the_candidate_with_the_best_mean_reward_on_the_choosing_split():
    chooser = ColourEnv(colour_samples(["red", "blue", "blue", "green", "blue"]))
    candidates = blind.candidate_answers(chooser, limit=10)
    assert candidates == ["red", "blue", "green"]  # distinct ideal answers, in sample order
    answer, reward = blind.best_constant(chooser, candidates)
    assert answer == "blue" and reward == pytest.approx((3 * 1.0 + 2 * 0.1) / 5)
    assert blind.candidate_answers(chooser, limit=2) == ["red", "blue"]


def test_constant_records_score_the_answer_on_every_sample():
    env = ColourEnv(colour_samples(["blue", "red", "red", "yellow"]))
    records = blind.constant_records(env, "red")
    assert [r["policy"] for r in records] == ["constant"] * 4
    assert [r["answer"] for r in records] == ["red"] * 4
    assert [r["reward"] for r in records] == pytest.approx([0.1, 1.0, 1.0, 0.1])
    assert [r["parsed"]["said"] for r in records] == ["red"] * 4


def test_an_env_without_ideal_answers_proposes_no_constant():
    class NoIdeal(ColourEnv):
        def ideal_answer(self, meta):
            return super(ColourEnv, self).ideal_answer(meta)  # the base class: MissingPart

    assert blind.candidate_answers(NoIdeal(colour_samples(["red"])), limit=4) == []


def test_blanked_observations_keep_sizes_and_text_but_hold_no_pixel_of_the_image():
    env = ColourEnv(colour_samples(["red"], size=(16, 12)))
    _, observation = env.reset(0)
    blank = blind.blank_observation(observation)
    assert blank["messages"] == observation["messages"]
    assert [im.size for im in blank["images"]] == [(16, 12)]
    assert np.unique(np.asarray(blank["images"][0]).reshape(-1, 3), axis=0).tolist() == [list(blind.BLANK_GREY)]
    assert np.asarray(observation["images"][0])[0, 0].tolist() == list(COLOURS["red"])  # the original is untouched


def test_the_rollout_settings_name_the_baselines_and_refuse_unknown_or_clashing_policies():
    assert blind.baseline_policies(RolloutParams()) == ["constant", "sft_blind", "grpo_blind"]
    assert blind.baseline_policies(RolloutParams(constant_baseline=False, blind_policies=[])) == []
    with pytest.raises(ParamsError, match="blind_policies"):
        RolloutParams(policies=["base", "sft"], blind_policies=["grpo"])
    with pytest.raises(ParamsError, match="baseline names"):
        RolloutParams(policies=["constant"], blind_policies=[])


def records(answers, colours, policy):
    env = ColourEnv(colour_samples(colours))
    out = []
    for i, answer in enumerate(answers):
        state, _ = env.reset(i)
        _, _, reward, _, info = env.step_text(state, answer)
        out.append(rollout_record(ColourEnv, state.key, answer, reward, info, state.meta, policy=policy))
    return out


def test_evaluation_reports_each_trained_policy_against_the_baselines_and_warns_when_it_does_not_beat_them(
        tmp_path):
    rng = np.random.default_rng(0)
    colours = [sorted(COLOURS)[int(i)] for i in rng.integers(4, size=60)]
    looks = records(colours, colours, "sft")  # sft reads the colour: always right
    guesses = records(["blue"] * 60, colours, "grpo")  # grpo answers one colour whatever the image
    baselines = {"constant": records(["blue"] * 60, colours, "constant"),
                 "sft_blind": records(["blue"] * 60, colours, "sft_blind"),
                 "grpo_blind": records(["blue"] * 60, colours, "grpo_blind")}
    images = {r["id"]: [Image.new("RGB", (8, 6))] for r in looks}
    outputs = write_evaluation(ColourEnv, {"sft": looks, "grpo": guesses}, images, out_root=tmp_path,
                               n_resamples=200, baseline_records=baselines)
    metrics = json.loads((tmp_path / "metrics" / "eval.json").read_text())
    assert {"constant", "sft_blind", "grpo_blind", "sft_minus_constant", "sft_minus_sft_blind",
            "grpo_minus_constant", "grpo_minus_grpo_blind"} <= set(metrics)
    assert metrics["sft_minus_constant"]["mean_reward_ci_low"] > 0
    assert metrics["grpo_minus_constant"]["mean_reward"] == 0
    blind_warnings = [w for w in outputs.warnings if "does not beat" in w]
    assert len(blind_warnings) == 2 and all("'grpo'" in w for w in blind_warnings)
    table = (tmp_path / "reports" / "eval.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| metric"))
    assert "constant" in header and "sft_blind" in header and "sft_minus_constant" not in header
    assert BLIND_HEADING in table and "sft - constant (test)" in table
    # the baselines answer one thing by construction: the collapse check leaves them alone, not grpo
    collapse = [w for w in outputs.warnings if "collapse threshold" in w]
    assert len(collapse) == 1 and "'grpo'" in collapse[0]


def test_sampled_answers_give_each_prompt_its_mean_best_reward_and_pass_at_k(monkeypatch):
    from vlmgym.eval.metrics import evaluate, statistics_for
    from vlmgym.eval.sampled import attach_sampled

    colours = ["red", "blue", "green"]
    greedy = records(["red", "red", "red"], colours, "sft")
    sampled = records(["red", "yellow", "blue", "blue", "red", "yellow"], [c for c in colours for _ in (0, 1)],
                      "sft")
    for record, i in zip(sampled, (0, 0, 1, 1, 2, 2)):
        record["id"] = greedy[i]["id"]
    monkeypatch.setattr(ColourEnv, "solved", classmethod(lambda cls, r: r["parsed"]["said"] == r["truth"]["colour"]))
    attached = attach_sampled(ColourEnv, greedy, sampled)
    assert [a["sampled"]["solved"] for a in attached] == [True, True, False]
    assert [a["sampled"]["mean_reward"] for a in attached] == pytest.approx([0.55, 1.0, 0.1])
    assert [a["sampled"]["best_reward"] for a in attached] == pytest.approx([1.0, 1.0, 0.1])
    figures = evaluate(ColourEnv, attached, n_resamples=50)
    assert figures["pass_at_k"] == pytest.approx(2 / 3)
    assert figures["sampled_mean_reward"] == pytest.approx((0.55 + 1.0 + 0.1) / 3)
    assert figures["best_of_k_reward"] == pytest.approx((1.0 + 1.0 + 0.1) / 3)
    assert figures["mean_reward"] == pytest.approx((1.0 + 0.1 + 0.1) / 3)  # greedy, as before
    monkeypatch.setattr(ColourEnv, "solved", classmethod(lambda cls, r: None))  # graded reward: no pass@k
    assert "pass_at_k" not in statistics_for(ColourEnv, attach_sampled(ColourEnv, greedy, sampled))
    with pytest.raises(ValueError, match="1 prompts have none"):
        attach_sampled(ColourEnv, greedy, sampled[:4])


@pytest.mark.parametrize(("env", "right", "wrong"), [
    ("digits", {"pred_answer": "1, 3", "truth": {"task": "sort", "digits": [3, 1], "answer": "1, 3"}},
     {"pred_answer": "1, 4", "truth": {"task": "sort", "digits": [3, 1], "answer": "1, 3"}}),
    ("message_decoding", {"pred_answer": "house", "truth": {"answer": "house"}},
     {"pred_answer": "mouse", "truth": {"answer": "house"}}),
    ("nlvr2", {"pred_label": True, "truth": {"label": True, "sentence": "There is a red object in the left image."}},
     {"pred_label": None, "truth": {"label": True, "sentence": "There is a red object in the left image."}}),
    ("rec", {"pred_box": [0, 0, 500, 500], "truth": {"bbox_2d": [0, 0, 500, 450]}},
     {"pred_box": [0, 0, 500, 200], "truth": {"bbox_2d": [0, 0, 500, 450]}}),
    ("ovd", {"pred_boxes": [["cat", [0, 0, 500, 500]]], "parsed": {"n_items": 1},
             "truth": {"boxes": [{"label": "cat", "bbox_2d": [0, 0, 500, 450]}]}},
     {"pred_boxes": [["cat", [0, 0, 500, 500]], ["cat", [0, 0, 500, 500]]], "parsed": {"n_items": 2},
      "truth": {"boxes": [{"label": "cat", "bbox_2d": [0, 0, 500, 450]}]}}),
])
def test_the_built_in_envs_correctness_bit_is_their_exact_accuracy(env, right, wrong):
    from vlmgym.envs import env_class

    cls = env_class(env)
    assert cls.solved({"id": "a", "reward": 1.0, **right}) is True
    assert cls.solved({"id": "b", "reward": 0.5, **wrong}) is False
    assert env_class("geospot").solved({"id": "c"}) is None  # graded: no pass@k
