"""nlvr2 env: answer parsing, rewards, observations, and samples served from explicit lists."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from PIL import Image

from vlmgym.envs.nlvr2 import NLVR2Env, parse_answer


@dataclass
class FakeSample:
    key: str
    images: list
    meta: dict = field(default_factory=dict)


def make_samples(labels: list[bool]) -> list[FakeSample]:
    return [FakeSample(f"k{i}", [Image.new("RGB", (16, 12), "red"), Image.new("RGB", (16, 12), "blue")],
                       {"id": f"id{i}", "sentence": f"There are exactly {i} circles in the left image.", "label": lab})
            for i, lab in enumerate(labels)]


@pytest.mark.parametrize("text, expected", [
    ("True", True), ("False", False), ("true", True), ("FALSE", False), ("True.", True), ("  false.\n", False),
    ("yes", True), ("No", False), ("Yes, the statement is true.", True), ("No, it is false!", False),
    ("The answer: **True**", True), ("(false)", False),
    ("untrue", None), ("falsehood", None), ("known", None), ("nothing", None), ("trueish", None),
    ("true or false", None), ("Yes... no", None), ("True. Actually False.", None),
    ("", None), ("   ", None), ("maybe", None), ("1", None),
])
def test_parse_answer(text, expected):
    assert parse_answer(text) is expected


@pytest.fixture(scope="module")
def env():
    return NLVR2Env(samples=make_samples([True, False, True]))


def test_reset_gives_two_images_and_the_statement(env):
    state, obs = env.reset(1)
    assert len(obs["images"]) == 2 and obs["images"][1].getpixel((0, 0)) == (0, 0, 255)
    (message,) = obs["messages"]
    assert message["role"] == "user"
    assert [part["type"] for part in message["content"]] == ["image", "image", "text"]
    text = message["content"][2]["text"]
    assert "There are exactly 1 circles in the left image." in text and "True or False" in text
    assert state.truth is False and state.meta["id"] == "id1" and state.key == "k1"
    assert set(obs) == {"images", "messages"}  # the truth stays in the state
    assert env.reset(4)[0].key == "k1"  # cycles over the samples
    assert len(env) == 3


@pytest.mark.parametrize("idx, text, reward, answer, format_ok", [
    (0, "True", 1.0, "True", True),
    (0, "true.", 1.0, "True", True),
    (0, "Yes", 1.0, "True", False),
    (0, "False", 0.0, "False", True),
    (1, "False", 1.0, "False", True),
    (1, "no", 1.0, "False", False),
    (1, "The statement is false.", 1.0, "False", False),
    (1, "untrue", 0.0, None, False),
    (1, "true or false", 0.0, None, False),
    (0, "true or false", 0.0, None, False),
    (0, "", 0.0, None, False),
    (1, "", 0.0, None, False),
])
def test_step_text_rewards(env, idx, text, reward, answer, format_ok):
    state, _ = env.reset(idx)
    new_state, extra, got, done, info = env.step_text(state, text)
    assert (got, done, extra) == (reward, True, [])
    assert new_state.done and new_state.answer == text and not state.done  # the reset state is reusable
    assert info["answer"] == answer and info["correct"] == (reward == 1.0) and info["format_ok"] == format_ok
    assert info["reward_components"] == {"correct": reward}
    assert info["parse_failed"] == (answer is None)
    assert info["pred_label"] == {"True": True, "False": False, None: None}[answer]


def test_ideal_answer_scores_one(env):
    for idx in range(len(env)):
        state, _ = env.reset(idx)
        answer = NLVR2Env.ideal_answer(env.samples[idx].meta)
        assert answer in ("True", "False")
        assert env.step_text(state, answer)[2] == 1.0


def test_step_decodes_tokens_with_the_tokenizer():
    class CharTokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids if i != 0 or not skip_special_tokens)

    env = NLVR2Env(make_samples([False]), tokenizer=CharTokenizer())
    state, _ = env.reset(0)
    assert env.step(state, [ord(c) for c in "False"] + [0])[2] == 1.0
    assert env.step(state, [ord(c) for c in "True"])[2] == 0.0
    with pytest.raises(ValueError, match="tokenizer"):
        NLVR2Env(samples=make_samples([False])).step(state, [70])


@pytest.mark.parametrize("bad, message", [
    (FakeSample("x", [Image.new("RGB", (4, 4))], {"sentence": "s", "label": True}), "1 images"),
    (FakeSample("x", [Image.new("RGB", (4, 4))] * 2, {"sentence": "", "label": True}), "no sentence"),
    (FakeSample("x", [Image.new("RGB", (4, 4))] * 2, {"sentence": "s", "label": "True"}), "label 'True'"),
])
def test_bad_samples_fail_clearly(bad, message):
    with pytest.raises(ValueError, match=message):
        NLVR2Env(samples=[bad])
    with pytest.raises(ValueError, match="no samples"):
        NLVR2Env(samples=[])


def test_corpus_covers_prompt_answers_and_statement_words():
    corpus = NLVR2Env.corpus()
    text = " ".join(corpus)
    for word in ("True", "False", "yes", "no", "triangles", "yellow", "above", "Neither", "combined", "fewer"):
        assert word in text
    assert any("Is the statement true or false?" in line for line in corpus)
    assert NLVR2Env.corpus() == corpus  # deterministic
