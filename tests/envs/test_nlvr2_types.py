"""nlvr2 statement types: read back from the wording, per-type accuracy with intervals, the report's type table,
and the generator's template and crowding knobs."""

from __future__ import annotations

import random

import numpy as np
import pytest

from vlmgym.envs.nlvr2 import NLVR2Env
from vlmgym.envs.nlvr2 import data as nlvr2
from vlmgym.envs.nlvr2.types import TEMPLATE_TYPES, statement_type, type_statistics
from vlmgym.eval.metrics import compare, evaluate


@pytest.mark.parametrize("template", sorted(nlvr2.TEMPLATES))
def test_every_template_is_read_back_from_its_wording(template):
    rng = random.Random(f"types-{template}")
    for _ in range(400):  # every phrase, side, number and relation the template can draw
        text = nlvr2.TEMPLATES[template](rng).text
        assert statement_type(text) == template, text


def test_generated_pairs_are_typed_as_their_template():
    pairs = nlvr2.generate_split(2, "test", 200, 256, 192)
    assert [statement_type(p.sentence) for p in pairs] == [p.template for p in pairs]
    assert set(TEMPLATE_TYPES) == set(nlvr2.TEMPLATES)


@pytest.mark.parametrize("sentence", [
    "The left image contains two dogs, and the right image shows a leash.",  # the real NLVR2
    "There is a red circle in the middle image.", "Every circle in the left image is red and blue.", "", None, 3,
])
def test_other_sentences_have_no_type(sentence):
    assert statement_type(sentence) is None


def record(i, sentence, label, said):
    return {"id": f"s{i}", "answer": str(said), "pred_label": said, "reward": float(said is label),
            "format_ok": said is not None, "truth": {"label": label, "sentence": sentence}}


EXISTS = "There is a red circle in the left image."
COUNT = "There are exactly two squares in the right image."
HUB = "The left image contains two dogs."


@pytest.fixture()
def records():
    # exists: 1 of 4 right; count_exact: 3 of 3 right; a hub sentence, wrong; no other type
    return [record(0, EXISTS, True, True), record(1, EXISTS, True, False), record(2, EXISTS, False, True),
            record(3, EXISTS, False, None), record(4, COUNT, True, True), record(5, COUNT, False, False),
            record(6, COUNT, True, True), record(7, HUB, False, True)]


def test_per_type_accuracy_on_constructed_records(records):
    stats = NLVR2Env.task_statistics(records)
    assert set(stats) == {"accuracy", "accuracy_exists", "accuracy_count_exact"}  # absent types are left out
    assert stats["accuracy"].point() == pytest.approx(4 / 8)
    assert stats["accuracy_exists"].point() == pytest.approx(1 / 4)
    assert stats["accuracy_count_exact"].point() == pytest.approx(1.0)


def test_per_type_accuracy_gets_intervals_and_paired_differences(records):
    flat = evaluate("nlvr2", records, n_resamples=200, seed=0)
    for name in ("accuracy_exists", "accuracy_count_exact"):
        assert 0 <= flat[f"{name}_ci_low"] <= flat[name] <= flat[f"{name}_ci_high"] <= 1
    assert flat["accuracy_exists_ci_low"] < flat["accuracy_exists_ci_high"]  # 1 of 4 varies under resampling
    always_true = [{**r, "pred_label": True, "answer": "True", "reward": float(r["truth"]["label"])} for r in records]
    diff = compare("nlvr2", always_true, records, n_resamples=200, seed=0)
    assert diff["accuracy_exists"] == pytest.approx(2 / 4 - 1 / 4)
    assert diff["accuracy_count_exact"] == pytest.approx(2 / 3 - 1)


def test_type_statistics_needs_one_flag_per_record(records):
    stats = type_statistics(records, np.array([1, 0, 0, 0, 1, 1, 1, 0], np.float64))
    assert stats["accuracy_exists"].point() == pytest.approx(1 / 4)


def test_report_shows_each_type_with_how_often_a_policy_says_true(records):
    always_true = [{**r, "pred_label": True} for r in records]
    page = NLVR2Env.report_html({"sft": always_true, "grpo": records}, None)
    assert "Statement types" in page and "sft: says True" in page and "grpo: right" in page
    exists_row = page.split(TEMPLATE_TYPES["exists"][0])[1].split("</tr>")[0]
    # 4 samples, 50% true; sft says True on all and is right on half; grpo says True on 2 of 4, right on 1 of 4
    assert [c.split("<")[0] for c in exists_row.split("<td>")[1:]] == ["4", "50%", "100%", "50%", "50%", "25%"]
    assert "other (not a template)" in page and TEMPLATE_TYPES["spatial"][0] not in page


def test_generator_knobs_pick_templates_and_crowding():
    default = nlvr2.generate_split(6, "train", 60, 256, 192)
    assert default == nlvr2.generate_split(6, "train", 60, 256, 192, sorted(nlvr2.TEMPLATES), nlvr2.MAX_OBJECTS)
    chosen = nlvr2.generate_split(6, "train", 60, 256, 192, ["exists", "every_colour"], 2)
    assert {p.template for p in chosen} == {"exists", "every_colour"}
    assert all(1 <= len(scene) <= 2 for p in chosen for scene in (p.left, p.right))
    assert sum(p.label for p in chosen) == 30
    big = nlvr2.generate_split(6, "train", 20, 256, 192, (), nlvr2.MAX_OBJECTS, 1.5)
    assert {round(o.radius, 6) for p in big for s in (p.left, p.right) for o in s} == {round(0.065 * 1.5 * 192, 6),
                                                                                       round(0.11 * 1.5 * 192, 6)}
    colour_only = nlvr2.generate_split(6, "train", 40, 256, 192, ["exists", "every_colour"], 4, 1.0, ["colour"])
    assert all(not any(w in p.sentence for w in (*nlvr2.SHAPES, *nlvr2.SIZES)) for p in colour_only)
    assert [statement_type(p.sentence) for p in colour_only] == [p.template for p in colour_only]
    with pytest.raises(ValueError, match="must include colour"):
        nlvr2.generate_split(6, "train", 4, 256, 192, (), 4, 1.0, ["shape"])
    with pytest.raises(ValueError, match="unknown templates"):
        nlvr2.generate_split(6, "train", 4, 256, 192, ["bogus"])
