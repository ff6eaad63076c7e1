"""The rec env's box convention (pixels <-> Qwen3-VL's 0-1000), IoU, the answer parser and the reward: hand-worked
cases and a 10,000-string fuzz test."""

from __future__ import annotations

import json
import math
import random

import pytest
from adversarial import adversarial, wordings

from vlmgym.envs.rec import RecEnv, RecParams, iou, parse_answer, pixels_to_qwen, qwen_to_pixels
from vlmgym.envs.rec.boxes import answer_json, ordered, xywh_to_xyxy
from vlmgym.envs.rec.parse import MAX_ANSWER_CHARS

TRUTH = [100, 100, 300, 300]


def _sample(box=TRUTH, label="small red circle"):
    from vlmgym.data.shards import Sample

    return Sample(key="k", images=[None], meta={"id": "k", "expression": "the red circle", "label": label,
                                                "bbox_2d": list(box)})


def _score(text, box=TRUTH, weight=0.1):
    env = RecEnv(samples=[_sample(box)], params=RecParams(format_weight=weight))
    state, _ = env.reset(0)
    return env.score(state, text)


# --- the box convention ---------------------------------------------------------------------


def test_pixels_to_qwen_by_hand():
    assert pixels_to_qwen((0, 0, 256, 192), 256, 192) == (0, 0, 1000, 1000)
    assert pixels_to_qwen((64, 48, 128, 96), 256, 192) == (250, 250, 500, 500)
    assert pixels_to_qwen((10.3, 0.2, 33.1, 47.9), 640, 480) == (16, 0, 52, 100)  # 16.09, 0.42, 51.7, 99.8
    assert pixels_to_qwen((0.128, 0, 1, 1), 256, 1) == (1, 0, 4, 1000)  # 0.5 rounds up
    assert pixels_to_qwen((-5, -1, 300, 200), 256, 192) == (0, 0, 1000, 1000)  # clipped
    assert qwen_to_pixels((250, 250, 500, 500), 256, 192) == (64.0, 48.0, 128.0, 96.0)
    assert xywh_to_xyxy([10, 20, 30, 40]) == (10, 20, 40, 60)
    for bad in ((1, 2, 3), (1, 2, 3, math.nan), (1, 2, 3, "4")):
        with pytest.raises(ValueError, match="four finite numbers"):
            pixels_to_qwen(bad, 10, 10)
    for width in (0, -1, math.inf, True):
        with pytest.raises(ValueError, match="width"):
            pixels_to_qwen((1, 2, 3, 4), width, 10)


def test_round_trips():
    rng = random.Random(0)
    for _ in range(2000):
        width, height = rng.randint(1, 5000), rng.randint(1, 5000)
        box = (rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0, width), rng.uniform(0, height))
        back = qwen_to_pixels(pixels_to_qwen(box, width, height), width, height)
        # half a unit at most: a thousandth of the side, halved (plus float noise)
        assert all(abs(a - b) <= size / 2000 + 1e-9 for a, b, size in zip(box, back, (width, height) * 2))
        units = tuple(rng.randint(0, 1000) for _ in range(4))
        assert pixels_to_qwen(qwen_to_pixels(units, width, height), width, height) == units  # exact
    # the same relative box on the image at another size: what the shard stage's resizing does
    assert pixels_to_qwen((64, 48, 128, 96), 256, 192) == pixels_to_qwen((32, 24, 64, 48), 128, 96)


def test_iou_by_hand():
    assert iou(TRUTH, TRUTH) == 1.0
    assert iou(TRUTH, (100, 100, 300, 200)) == 0.5
    assert iou(TRUTH, (200, 200, 400, 400)) == pytest.approx(10_000 / 70_000)
    assert iou(TRUTH, (300, 300, 400, 400)) == 0.0  # touching corners
    assert iou(TRUTH, (150, 150, 150, 250)) == 0.0 and iou((5, 5, 5, 5), (5, 5, 5, 5)) == 0.0  # degenerate
    assert iou(TRUTH, (0, 0, 1000, 1000)) == pytest.approx(40_000 / 1_000_000)
    assert ordered((300, 10, 100, 5)) == (100, 5, 300, 10)


# --- the parser and the reward ---------------------------------------------------------------


def test_ideal_answer_scores_the_maximum():
    answer = RecEnv(samples=[_sample()], params=RecParams(label_first=False)).ideal_answer(_sample().meta)
    assert answer == '[{"bbox_2d": [100, 100, 300, 300], "label": "small red circle"}]'
    reward, info = _score(answer)
    assert reward == 1.0 and info["format_ok"] and info["iou"] == 1.0 and info["n_boxes"] == 1
    assert info["reward_components"] == pytest.approx({"format": 0.1, "iou": 0.9})


def test_label_first_writes_the_label_before_the_box_and_scores_the_same():
    env = RecEnv(samples=[_sample()])  # the default
    answer = env.ideal_answer(_sample().meta)
    assert answer == '[{"label": "small red circle", "bbox_2d": [100, 100, 300, 300]}]'
    assert '[{"label": "...", "bbox_2d": [x1, y1, x2, y2]}]' in env.prompt(_sample())
    qwen_order = RecEnv(samples=[_sample()], params=RecParams(label_first=False))
    assert '[{"bbox_2d": [x1, y1, x2, y2], "label": "..."}]' in qwen_order.prompt(_sample())
    reward, info = _score(answer)  # the reward reads either order, whatever the setting
    assert reward == 1.0 and info["format_ok"]
    assert json.loads(answer_json((1, 2, 3, 4), 'a "quoted" label')) == [{"bbox_2d": [1, 2, 3, 4],
                                                                         "label": 'a "quoted" label'}]


@pytest.mark.parametrize(("text", "overlap", "format_ok"), [
    ('[{"bbox_2d": [100, 100, 300, 200], "label": "x"}]', 0.5, True),           # half the truth
    ('[{"bbox_2d": [200, 200, 400, 400], "label": "x"}]', 1 / 7, True),         # 100x100 of 70,000 units
    ('[{"bbox_2d": [300, 300, 100, 100], "label": "x"}]', 1.0, False),          # swapped corners
    ('[{"bbox_2d": [300, 100, 100, 300]}]', 1.0, False),                        # swapped x only
    ('[{"bbox_2d": [100.4, 99.6, 300.0, 3e2], "label": "x"}]', 1.0, False),    # floats (IoU ~ 1)
    ('[{"bbox_2d": [-50, 100, 300, 1e9], "label": "x"}]', 4 / 27, False),       # (0, 100, 300, 1000): 40k / 270k
    ('[{"bbox_2d": [100, 100, 300, 300]}]', 1.0, True),                         # no label
    ('```json\n[{"bbox_2d": [100, 100, 300, 300], "label": "x"}]\n```', 1.0, True),  # Qwen's fence
    ('The box is [{"bbox_2d": [100, 100, 300, 300], "label": "x"}]. Done.', 1.0, False),  # extra text
    ('{"bbox_2d": [100, 100, 300, 300], "label": "x"}', 1.0, False),            # a bare dict
    ("[100, 100, 300, 300]", 1.0, False),                                        # a bare list
    ('[{"bbox_2d": [100, 100, 300, 300]}, {"bbox_2d": [0, 0, 10, 10]}]', 1.0, False),  # two boxes: the first
    ('[{"bbox_2d": [0, 0, 10, 10]}, {"bbox_2d": [100, 100, 300, 300]}]', 0.0, False),  # the first is wrong
    ('[{"bbox_2d": [150, 100, 150, 300], "label": "x"}]', 0.0, True),           # zero width
    ('[{"bbox_2d": [100, 100, 300], "label": "x"}]', 0.0, False),              # three numbers
    ('[{"bbox_2d": [100, 100, 300, 300, 400]}]', 0.0, False),                  # five
    ('[{"bbox_2d": [NaN, 100, 300, 300]}]', 0.0, False),
    ('[{"bbox_2d": [100, 100, 300, 300], "label": "x", "score": 1}]', 1.0, False),  # another key
    ('[{"bbox_2d": [100, 100, 300, 300], "label": 7}]', 1.0, False),          # a label that is no string
    ("(100, 100, 300, 300)", 0.0, False),                                        # not a list
    ('<think>[0, 0, 10, 10]?</think>[{"bbox_2d": [100, 100, 300, 300]}]', 1.0, False),  # reasoning is not read
    ('[-1e309, 100, 300, 300] [100, 100, 300, 300]', 1.0, False),              # no float: not a box
    ("", 0.0, False),
])
def test_reward_by_hand(text, overlap, format_ok):
    reward, info = _score(text)
    assert info["iou"] == pytest.approx(overlap, abs=1e-2) and info["format_ok"] is format_ok
    assert reward == pytest.approx(0.1 * format_ok + 0.9 * info["iou"])
    assert info["parse_failed"] is (info["bbox_2d"] is None)


def test_several_boxes_are_counted_and_the_first_is_scored():
    parsed = parse_answer('[{"bbox_2d": [1, 2, 3, 4]}, {"bbox_2d": [5, 6, 7, 8]}, [9, 9, 9.5, 10]]')
    assert parsed.box == (1, 2, 3, 4) and parsed.n_boxes == 3 and not parsed.format_ok
    assert parse_answer("[1,1,2,2] " * 500).n_boxes == 100  # counted up to a cap


def test_format_weight_is_the_env_setting():
    assert _score('[{"bbox_2d": [0, 0, 10, 10]}]', weight=0.5)[0] == 0.5
    assert _score("[100, 100, 300, 200]", weight=0.0)[0] == 0.5
    assert _score("[100, 100, 300, 300]", weight=1.0)[0] == 0.0


def test_garbage_scores_zero():
    for text in ("\x00 perhaps {{", "I cannot tell.", "[[[[", "]]]", '{"bbox_2d": "left"}', "NaN", "[inf, 1, 2, 3]",
                 '[{"bbox_2d": [Infinity, -Infinity, NaN, 1]}]', "[1e999]", "[" * 100_000, None, 42):
        reward, info = _score(text)
        assert reward == 0.0 and not info["format_ok"] and info["parse_failed"], text


def test_only_the_first_characters_are_read():
    box = '[{"bbox_2d": [100, 100, 300, 300]}]'
    assert _score(" " * (MAX_ANSWER_CHARS - len(box)) + box)[1]["iou"] == 1.0
    reward, info = _score("x" * MAX_ANSWER_CHARS + box)
    assert reward == 0.0 and info["parse_failed"]


def _adversarial(rng: random.Random) -> str:
    kind = rng.randrange(14)
    number = lambda: rng.choice(("1e308", "-1e308", "1e999", "-0", ".5", "5.", "+7", "NaN", "nan", "Infinity",  # noqa: E731
                                 "-inf", str(rng.randrange(-2000, 3000)), str(rng.uniform(-1e6, 1e6)),
                                 "9" * rng.randrange(1, 400), "0x1F", "1_000", "١٢"))
    if kind == 0:
        return "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(60))).encode(
            "utf-8", "replace").decode("utf-8", "replace")
    if kind == 1:
        return "[" + ", ".join(number() for _ in range(4)) + "]"
    if kind == 2:
        return json.dumps([{"bbox_2d": [number() for _ in range(rng.randrange(6))], "label": "x"}])
    if kind == 3:
        return '[{"bbox_2d": [' + ", ".join(number() for _ in range(4)) + '], "label": "x"}]'
    if kind == 4:
        depth = rng.randrange(1, 3000)
        return "[" * depth + "1, 2, 3, 4" + "]" * rng.randrange(depth + 1)  # nested junk
    if kind == 5:
        return "".join(rng.choice('[]{},:" 0123456789.-+eE\nbbox_2d') for _ in range(rng.randrange(200)))
    if kind == 6:
        return rng.choice(("[", "{", "9", " ", ",")) * rng.randrange(1, 1_000_000 if rng.random() < 0.01 else 30_000)
    if kind == 7:
        return "```json\n" + "".join(rng.choice("[{]}") for _ in range(rng.randrange(50))) + "\n```"
    if kind == 8:
        return "\ud800" + '[{"bbox_2d": [1, 2, 3, 4]}]'  # a lone surrogate, as a broken decode can leave
    if kind == 9:
        return json.dumps([{"bbox_2d": [rng.randrange(-5, 1006) for _ in range(4)], "label": "l"}
                           for _ in range(rng.randrange(4))])
    if kind == 10:
        return "[" + ",".join(" " * rng.randrange(5000) for _ in range(4)) + "]"
    if kind == 11:
        return "[" + "1" * rng.randrange(1, 50_000) + ", 2, 3, 4"
    if kind == 12:
        return '{"bbox_2d": {"bbox_2d": [[' + ", ".join(number() for _ in range(4)) + "]]}}"
    return "".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(120)))


def test_score_never_raises_and_stays_in_range():
    rng = random.Random(0)
    boxes = ([0, 0, 1000, 1000], TRUTH, [999, 999, 1000, 1000], [0, 500, 3, 501])
    env = RecEnv(samples=[_sample(box) for box in boxes])
    states = [env.reset(i)[0] for i in range(len(boxes))]
    for i in range(10_000):
        text = _adversarial(rng)
        reward, info = env.score(states[i % len(states)], text)
        assert 0.0 <= reward <= 1.0 and math.isfinite(reward), (text[:80], reward)
        assert 0.0 <= info["iou"] <= 1.0 and isinstance(info["format_ok"], bool)
        assert set(info["reward_components"]) == {"format", "iou"}
        box = info["bbox_2d"]
        assert box is None or (len(box) == 4 and all(0 <= v <= 1000 for v in box) and box[0] <= box[2]
                               and box[1] <= box[3])
        json.dumps(info, allow_nan=False)  # the record is plain JSON


BOX_JUNK = [*adversarial("rec"), "[-1e999, -1e999, 1e999, 1e999]", '[{"bbox_2d": [-1e309, 0, 1e309, 1e309]}]',
            "[" + ", ".join(["-" + "9" * 400] * 2 + ["9" * 400] * 2) + "]",  # beyond a float: inf
            '<think>[{"bbox_2d": [100, 100, 300, 300]}]</think>', '<think>[{"bbox_2d": [0, 0, 1000, 1000]}]',
            '{"bbox_2d": [null, null, null, null]}', '{"bbox_2d": ["0", "0", "1000", "1000"]}']


@pytest.mark.parametrize("box", ['[{"bbox_2d": [100, 100, 300, 300], "label": "small red circle"}]',
                                 "[100, 100, 300, 300]"])
def test_worded_boxes_earn_no_more_than_the_bare_box(box):
    """The box is read wherever it stands (the module docstring), so a negated or hedged box, or the right box
    before a wrong one, earns its IoU share as a box outside the format does -- never the format share, never
    more; a wrong box first scores that wrong box."""
    bare = _score("[100, 100, 300, 300]")[0]
    assert bare == pytest.approx(0.9)  # the IoU share alone: the format-invalid reward of the right box
    wrong = box.replace("100, 100, 300, 300", "500, 500, 900, 900")
    for text in wordings(box, wrong):
        reward, info = _score(text)
        assert reward <= bare and not info["format_ok"] and info["reward_components"]["format"] == 0.0, text
    for text in (f"{wrong} or {box}", f"either {wrong} or {box}"):
        assert _score(text)[0] == 0.0


def test_answers_without_a_finite_box_score_zero():
    """Non-finite numbers (clipped, they would make the whole image), boxes only inside a think block, and other
    envs' answers earn nothing, even against the whole-image truth."""
    boxes = (TRUTH, [0, 0, 1000, 1000], [0, 0, 500, 1000])
    env = RecEnv(samples=[_sample(box) for box in boxes])
    states = [env.reset(i)[0] for i in range(len(boxes))]
    for text in BOX_JUNK:
        for state in states:
            reward, info = env.score(state, text)
            assert reward == 0.0 and info["reward_components"] == {"format": 0.0, "iou": 0.0}, (state.truth, text[:80])
            assert info["parse_failed"] and not info["format_ok"]
