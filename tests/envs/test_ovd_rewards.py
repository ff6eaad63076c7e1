"""ovd's rewards: VLM-R1's three OVD rewards as published, on identical inputs, against values worked out by hand
from the reference (github.com/om-ai-lab/VLM-R1, src/open-r1-multimodal/src/open_r1/grpo_jsonl.py at commit
90052f478646e38bc67363862f699b7afca6b337: odLength_reward / map_reward / calculate_map, detection_score and its
iou, cosine_reward), their quirks, and the default `f1`, which no junk farms."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pytest
from adversarial import adversarial

from vlmgym.envs.base import State
from vlmgym.envs.ovd import OvdEnv, vlm_r1

A, B = ("red circle", (0, 0, 100, 100)), ("blue square", (200, 200, 300, 300))
TRUTH = [A, B]


def fenced(*items) -> str:
    return "```json\n" + json.dumps([{"bbox_2d": list(box), "label": label} for label, box in items]) + "\n```"


def plain(*items) -> str:
    return json.dumps([{"bbox_2d": list(box), "label": label} for label, box in items])


def _env(reward: str = "f1") -> OvdEnv:
    samples = OvdEnv.generate(6, seed=3, split="test")
    return OvdEnv(samples=samples, params=replace(OvdEnv.Params(), reward=reward))


def _score(text: str, truth=TRUTH, reward: str = "f1") -> tuple[float, dict]:
    env = _env(reward)
    meta = {"id": "x", "categories": ["red circle", "blue square", "green triangle"],
            "boxes": [{"bbox_2d": list(box), "label": label} for label, box in truth]}
    return env.score(State(idx=0, key="x", meta=meta, truth=[(lab, tuple(b)) for lab, b in truth]), text)


# --- VLM-R1 as published --------------------------------------------------------------------


def test_vlm_r1_iou_is_the_plus_one_pixel_one():
    assert vlm_r1.r1_iou([0, 0, 100, 100], [0, 0, 100, 100]) == 1.0
    # intersection x 200..299 (100), y 200..249 (50): 5000 over 5000 + 10000 - 5000
    assert vlm_r1.r1_iou([200, 200, 300, 250], [200, 200, 300, 300]) == 0.5
    # [0, 0, 10, 10] and [9, 0, 20, 10]: inter_x1 9 < inter_x2 min(9, 19) = 9 fails, so no overlap at all
    assert vlm_r1.r1_iou([0, 0, 10, 10], [9, 0, 20, 10]) == 0.0


def test_weighted_sum_by_hand():
    # matches: (p1, A) IoU 1, right label: 1; (p2, B) IoU 0.5 >= 0.5, wrong label: 0; p3 unmatched.
    # position (1 + 0) / 2 = 0.5; completeness 1 - (0 / 2 + 1 / 3) / 2 = 5 / 6; (0.7 x 0.5 + 0.3 x 5 / 6) / 1 = 0.6
    text = fenced(A, ("green circle", (200, 200, 300, 250)), ("red circle", (500, 500, 600, 600)))
    assert vlm_r1.weighted_sum(text, TRUTH) == pytest.approx(0.6)
    assert _score(text, reward="weighted_sum")[0] == pytest.approx(0.6)
    assert vlm_r1.weighted_sum(fenced(A, B), TRUTH) == pytest.approx(1.0)
    # the right boxes under wrong labels: matched, so completeness 1 pays gamma
    assert vlm_r1.weighted_sum(fenced(("x", A[1]), ("y", B[1])), TRUTH) == pytest.approx(0.3)
    # case does not matter (clean_text lower-cases), nor the answer tags (the last block is read)
    assert vlm_r1.weighted_sum(f"<answer>junk</answer><answer>{fenced(('RED Circle', A[1]), B)}</answer>",
                               TRUTH) == pytest.approx(1.0)
    assert vlm_r1.weighted_sum(plain(A, B), TRUTH) == 0.0  # no ```json fence: no boxes
    assert vlm_r1.weighted_sum("None", []) == 1.0 and vlm_r1.weighted_sum(fenced(A), []) == 0.0


def test_weighted_sum_reuses_the_previous_label_for_a_box_without_one():
    twins = [A, ("red circle", B[1])]
    unlabelled = "```json\n" + json.dumps([{"bbox_2d": list(A[1]), "label": "red circle"},
                                           {"bbox_2d": list(B[1])}]) + "\n```"
    assert vlm_r1.weighted_sum(unlabelled, twins) == pytest.approx(1.0)  # the second box borrows "red circle"
    assert _score(unlabelled, twins)[0] == pytest.approx(0.5)  # the default: an unlabelled item is no detection
    # on the first match VLM-R1 raises (pred_label unbound); here that match's label counts as wrong
    first = "```json\n" + json.dumps([{"bbox_2d": list(A[1])}]) + "\n```"
    assert vlm_r1.weighted_sum(first, [A]) == pytest.approx(0.3)


def test_od_length_by_hand():
    # COCO mAP: red circle one hit (AP 1), blue square a hit then a duplicate (precision 1 at recall 1: AP 1):
    # mAP 1; length factor min(1, 2 / 3)
    assert vlm_r1.od_length(fenced(A, B, B), TRUTH) == pytest.approx(2 / 3)
    assert vlm_r1.od_length(fenced(A, B), TRUTH) == pytest.approx(1.0)
    # only A found: red circle AP 1, blue square AP 0: mAP 0.5; labels are compared as written (case-sensitive)
    assert vlm_r1.od_length(fenced(A), TRUTH) == pytest.approx(0.5)
    assert vlm_r1.od_length(fenced(("Red Circle", A[1]), B), TRUTH) == pytest.approx(0.5)
    # a 0.72 box of red circle (a hit at 5 of the 10 thresholds) beside B: (0.5 + 1) / 2
    assert vlm_r1.od_length(fenced(("red circle", (0, 0, 100, 72)), B), TRUTH) == pytest.approx(0.75)


def test_od_length_reads_the_last_json_block_and_weighted_sum_the_first():
    text = f"{fenced(A, B)} or rather {fenced(('x', (600, 600, 700, 700)))}"
    assert vlm_r1.od_length(text, TRUTH) == 0.0
    assert vlm_r1.weighted_sum(text, TRUTH) == pytest.approx(1.0)
    swapped = f"{fenced(('x', (600, 600, 700, 700)))} or rather {fenced(A, B)}"
    assert vlm_r1.od_length(swapped, TRUTH) == pytest.approx(1.0)
    assert vlm_r1.weighted_sum(swapped, TRUTH) == 0.0


def test_od_length_pays_anything_without_a_fence_on_an_empty_truth():
    for junk in ("", "lorem ipsum", "None", "[1, 2, 3]"):
        assert vlm_r1.od_length(junk, []) == 1.0
    assert vlm_r1.od_length(fenced(A), []) == 0.0


def test_cosine_pays_length_alone():
    # accuracy hard-coded to 1: 1 - 0.5 x (1 - cos(pi x L / 1024)) / 2
    def count(text):
        return len(text)

    assert vlm_r1.cosine("", count) == 1.0
    assert vlm_r1.cosine("x" * 512, count) == pytest.approx(0.75)
    assert vlm_r1.cosine("x" * 1024, count) == pytest.approx(0.5)
    assert vlm_r1.cosine("x" * 2048, count) == pytest.approx(1.0)  # the cosine comes back round past 1024
    assert vlm_r1.cosine("x" * 100, count) == pytest.approx(1 - 0.5 * (1 - math.cos(100 * math.pi / 1024)) / 2)
    assert _score("", reward="cosine")[0] == 1.0  # the empty answer: the top reward


def test_the_ideal_answer_is_right_under_every_option():
    for reward in ("f1", "odLength", "weighted_sum"):
        env = _env(reward)
        for idx in range(len(env)):
            state, _ = env.reset(idx)
            assert env.step_text(state, env.ideal_answer(state.meta))[2] == pytest.approx(1.0), reward
    assert _env("odLength").ideal_answer({"boxes": [], "categories": ["a"]}) == "None"
    assert _env("f1").ideal_answer({"boxes": [], "categories": ["a"]}) == "[]"


# --- the default: f1 ------------------------------------------------------------------------


def test_f1_by_hand():
    assert _score(plain(A, B))[0] == 1.0
    assert _score(fenced(A, B))[0] == 1.0  # a fence is read too
    # one right box of two: 2 x 1 / (1 + 2)
    assert _score(plain(A))[0] == pytest.approx(2 / 3)
    # a 0.72 box: 2 x (0.72 + 1) / 4
    assert _score(plain(("red circle", (0, 0, 100, 72)), B))[0] == pytest.approx(0.86)
    # duplicates match nothing: 2 x 2 / (4 + 2)
    assert _score(plain(A, B, A, B))[0] == pytest.approx(2 / 3)
    # a box under every named category: the first listed counts, the rest add items
    hedged = plain(A, ("blue square", A[1]), ("green triangle", A[1]), B)
    assert _score(hedged)[0] == pytest.approx(2 * 2 / (4 + 2))
    wrong_first = plain(("blue square", A[1]), A, B)
    assert _score(wrong_first)[0] == pytest.approx(2 * 1 / (3 + 2))
    # the right boxes under wrong labels, boxes of absent categories, no boxes
    assert _score(plain(("green triangle", A[1]), ("green triangle", B[1])))[0] == 0.0
    assert _score(plain(("green triangle", (600, 600, 700, 700))))[0] == 0.0
    assert _score("[]")[0] == 0.0 and _score("")[0] == 0.0


def test_listing_every_category_never_beats_committing():
    categories = ["red circle", "blue square", "green triangle"]
    committed = _score(plain(A, B))[0]
    for order in range(3):
        labels = categories[order:] + categories[:order]
        everything = plain(*[(label, box) for _, box in TRUTH for label in labels])
        assert _score(everything)[0] <= 0.5 * committed
    grid = plain(*[(label, (x, y, x + 100, y + 100)) for label in categories for x in range(0, 1000, 100)
                   for y in range(0, 1000, 100)])
    assert _score(grid)[0] < 0.02


@pytest.mark.parametrize("reward", ["f1"])
def test_junk_earns_nothing_by_default(reward):
    env = _env(reward)
    states = [env.reset(i)[0] for i in range(len(env))]
    for text in adversarial("ovd"):
        for state in states:
            value, info = env.score(state, text)
            assert value == 0.0, text[:80]
            assert not info["format_ok"] or text.startswith("[{")
            json.dumps(info, allow_nan=False)


@pytest.mark.parametrize("reward", ["f1", "odLength", "weighted_sum", "cosine"])
def test_fuzz_every_option_stays_in_range_and_never_raises(reward):
    env = _env(reward)
    states = [env.reset(i)[0] for i in range(len(env))]
    rng = random.Random(0)
    pieces = ['[{"bbox_2d": [', "]", "}", "{", '"label": "red circle"', ", ", "100", "-5", "1e309", "NaN", "null",
              "```json\n", "```", "<answer>", "</answer>", "<think>", "None", '"', "0.5", "true", "[", "数"]
    texts = [*adversarial("ovd"), *(rng.choice(pieces) * 40 for _ in range(20))]
    while len(texts) < 1500:
        texts.append("".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))))
    for i, text in enumerate(texts):
        value, info = env.score(states[i % len(states)], text)
        assert 0.0 <= value <= 1.0 and math.isfinite(value), (reward, text[:80])
        assert isinstance(info["format_ok"], bool) and set(info["reward_components"]) == {reward}
        json.dumps(info, allow_nan=False)
