"""nlvr2 env: answer parsing, rewards, observations, and samples served from explicit lists."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from adversarial import BOTH_WORDS, HEDGES, NEGATIONS, TAGGED, adversarial, wordings
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
    # framings of the one word are read; a yes / no that disagrees with it is no verdict
    ("It's true.", True), ("The answer is: no", False), ("Verdict: FALSE", False), ("Yes, false", None),
    ("No, the statement is true.", None),
    # negations, both words and hedges say no one truth value
    ("The statement is not true", None), ("isn't true", None), ("not false", None), ("It is not false.", None),
    ("True or False", None), ("true and false", None), ("probably true", None), ("maybe false", None),
    ("I think true", None), ("Definitely true", None), ("true?", None),
    ("", None), ("   ", None), ("maybe", None), ("1", None),
    # not a short verdict: spam, an essay, tags, a trace's lookup
    ("true " * 13, None), ("The left image shows " + "a shape " * 10 + "so it is true.", None),
    ("<answer>True</answer>", None), ("<think>true</think>", None), ("red object: left yes, right yes.", None),
    (None, None),
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
        answer = env.ideal_answer(env.samples[idx].meta)  # no trace in these samples: the one word
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


def traced(labels: list[bool]) -> list[FakeSample]:
    samples = make_samples(labels)
    for sample, trace in zip(samples, ["left: blue, red. right: green.",
                                       "left: yellow. right: red, yellow. red object: left no, right yes."]):
        sample.meta["trace"] = trace
    return samples


def test_a_trace_comes_before_the_verdict_in_the_prompt_and_the_target():
    env = NLVR2Env(samples=traced([True, False]))
    assert env.params.trace  # on by default
    state, obs = env.reset(0)
    assert obs["messages"][0]["content"][2]["text"].endswith("Say what each image holds, then answer True or False.")
    assert env.sft_target(state.meta) == "left: blue, red. right: green. True"
    assert env.sft_target(env.reset(1)[0].meta) == ("left: yellow. right: red, yellow. red object: left no, right yes. "
                                                    "False")
    assert env.step_text(state, env.sft_target(state.meta))[2] == 1.0
    # without a trace (the hub's pairs) or with the option off: the one-word question and answer
    plain = NLVR2Env(samples=make_samples([True]))
    assert plain.reset(0)[1]["messages"][0]["content"][2]["text"].endswith("Answer with one word: True or False.")
    off = NLVR2Env(samples=traced([True]), params=NLVR2Env.Params(trace=False))
    assert off.sft_target(off.reset(0)[0].meta) == "True"
    assert off.reset(0)[1]["messages"][0]["content"][2]["text"].endswith("Answer with one word: True or False.")


@pytest.mark.parametrize("text, reward, format_ok, trace", [
    ("left: blue, red. right: green. True", 1.0, True, "left: blue, red. right: green."),
    ("left:  blue, red.  right: green.\nTrue.", 1.0, True, "left: blue, red. right: green."),
    ("left: red. right: red. True", 1.0, True, "left: red. right: red."),  # a wrong description: the verdict scores
    ("left: blue, red. right: green. False", 0.0, True, "left: blue, red. right: green."),
    ("True", 1.0, False, None),  # the verdict alone is right but not the asked form
    # a broken trace is no trace: the words before the verdict are not the answer's form
    ("left: blue, red. True", 0.0, False, None),
    ("left: blue, red. right: green.", 0.0, False, "left: blue, red. right: green."),
    ("left: red. right: blue. red object: left yes, right no. True", 1.0, True,
     "left: red. right: blue. red object: left yes, right no."),
    ("left: red. right: blue. red object: left maybe. True", 0.0, False, "left: red. right: blue."),
    # the lookup's yes / no are not read as the verdict
    ("left: red. right: blue. red object: left yes, right no. no", 0.0, False,
     "left: red. right: blue. red object: left yes, right no."),
])
def test_only_the_verdict_is_scored_and_the_trace_is_read_back(text, reward, format_ok, trace):
    env = NLVR2Env(samples=traced([True]))
    state, _ = env.reset(0)
    _, _, got, _, info = env.step_text(state, text)
    assert (got, info["format_ok"], info["trace"]) == (reward, format_ok, trace)


def test_trace_exact_counts_the_descriptions_of_samples_with_a_trace():
    env = NLVR2Env(samples=traced([True, False]) + make_samples([True]))
    answers = ["left: blue, red. right: green. True", "left: yellow. right: red. False", "True"]
    records = []
    for idx, text in enumerate(answers):
        state, _ = env.reset(idx)
        info = env.step_text(state, text)[4]
        records.append({**NLVR2Env.record_fields(info, state.meta), "key": state.key})
    stats = NLVR2Env.task_statistics(records)
    assert stats["accuracy"].values.tolist() == [1.0, 1.0, 1.0]
    exact = stats["trace_exact"]  # over the two samples with a trace: one exact
    assert exact.kind == "ratio" and exact.values.tolist() == [1.0, 0.0, 0.0]
    assert exact.denominator.tolist() == [1, 1, 0]
    assert "trace_exact" not in NLVR2Env.task_statistics(records[2:])  # no trace anywhere: no such metric
    off = NLVR2Env(samples=traced([True]), params=NLVR2Env.Params(trace=False))  # not asked for: not scored
    state, _ = off.reset(0)
    record = NLVR2Env.record_fields(off.step_text(state, "True")[4], state.meta)
    assert "trace" not in record["truth"] and "trace_exact" not in NLVR2Env.task_statistics([record])


VERDICT_JUNK = [*adversarial("nlvr2"), *(tagged(t) for t in ("True", "False", "yes") for tagged in TAGGED),
                "red object: left yes, right yes.", "left: red. right: blue. red object: left yes, right yes",
                "left: red. right: blue. " + "True " * 20, "True " + "x " * 50, "yes " * 1000]


def test_negations_both_words_and_hedges_score_zero():
    """Each truth value's answer words negated, beside the other value or hedged score 0 on both labels, alone and
    after the trace: read out of such an answer, the word would pay for what the answer does not say."""
    env = NLVR2Env(samples=traced([True, False]) + make_samples([True, False]))
    texts = [*NEGATIONS, *BOTH_WORDS, *HEDGES, *(text for right, wrong in (("True", "False"), ("False", "True"),
                                                                           ("yes", "no"), ("no", "yes"))
                                                 for text in wordings(right, wrong))]
    for index in range(len(env)):
        state = env.reset(index)[0]
        for text in texts:
            for answer in (text, f"{state.meta.get('trace', '')} {text}".strip()):
                reward, info = env.score(state, answer)
                assert reward == 0.0 and info["answer"] is None, (state.truth, answer)


def test_answers_that_are_no_verdict_score_zero():
    """Answer words in spam, tags, long text or a trace's lookup are no verdict, on either label, with and
    without a trace asked for."""
    env = NLVR2Env(samples=traced([True, False]) + make_samples([True, False]))
    states = [env.reset(i)[0] for i in range(len(env))]
    for text in VERDICT_JUNK:
        for state in states:
            reward, info = env.score(state, text)
            assert reward == 0.0 and info["reward_components"] == {"correct": 0.0}, (state.truth, text[:80])
            assert info["answer"] is None and info["parse_failed"] and not info["format_ok"]
