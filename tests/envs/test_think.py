"""The R1 think/answer option (vlmgym.envs.think) on every built-in env: prompt, structure, the answer block,
the combined reward, the SFT target, params, and a fuzz test."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from adversarial import TAGGED, adversarial

from vlmgym import envs
from vlmgym.envs import think
from vlmgym.params import EnvParams, ParamsError, from_dict

BUILTIN = ("geospot", "nlvr2", "digits", "message_decoding", "rec", "ovd", "user_data")


def _env(name: str, on: bool = True, weight: float = 0.1, n: int = 4):
    cls = envs.env_class(name)
    params = replace(cls.Params(), think=on, think_format_weight=weight)
    return cls(samples=cls.generate(n, seed=1, split="test"), params=params)


@pytest.mark.parametrize("text, ok", [
    ("<think>look at it</think><answer>7</answer>", True),
    ("  <think>\nmulti\nline\n</think>\n\n<answer>\n7\n</answer>\n", True),
    ("<think></think><answer></answer>", True),  # empty blocks are still the structure
    ("<answer>7</answer>", False),  # no think block
    ("<think>x</think>", False),  # no answer block
    ("<answer>7</answer><think>x</think>", False),  # wrong order
    ("so: <think>x</think><answer>7</answer>", False),  # text outside the blocks
    ("<think>x</think><answer>7</answer> done", False),
    ("<think>x</think><answer>7</answer><answer>8</answer>", False),  # a second answer block
    ("<think>a <think> b</think><answer>7</answer>", False),  # a stray tag inside
    ("<think>x</think>between<answer>7</answer>", False),
    ("", False),
])
def test_structure_is_one_think_then_one_answer_block(text, ok):
    assert think.structure_ok(text) is ok


@pytest.mark.parametrize("text, answer", [
    ("<think>x</think><answer> 7 </answer>", "7"),
    ("<answer>first</answer> and <answer>second</answer>", "first"),  # the first complete block
    ("<answer>unclosed", ""),
    ("no tags at all: 7", ""),
    ("<think>x</think><answer>a\nb</answer>", "a\nb"),
    # a block holding a tag is no answer: lenient parsers would read through it
    ("<answer><answer>7</answer></answer>", ""),
    ("<think>x</think><answer><think>y</think>7</answer>", ""),
    ("<think>x</think><answer>7</think></answer>", ""),
])
def test_the_answer_is_the_first_complete_answer_block(text, answer):
    assert think.answer(text) == answer


@pytest.mark.parametrize("name", BUILTIN)
def test_prompt_asks_for_the_tags_only_when_on(name):
    on, off = _env(name, on=True), _env(name, on=False)
    question = off.reset(0)[1]["messages"][0]["content"][-1]["text"]
    assert "<think>" not in question and question == off.prompt(off.samples[0])
    assert on.reset(0)[1]["messages"][0]["content"][-1]["text"] == f"{question} {think.INSTRUCTION}"


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("weight", [0.1, 0.3])
def test_rewards_of_the_structure_and_the_answer_block(name, weight):
    env, off = _env(name, weight=weight), _env(name, on=False)
    for idx in range(len(env)):
        state, _ = env.reset(idx)
        ideal = env.ideal_answer(state.meta)
        plain = off.step_text(state, ideal)[2]  # geospot's SFT target rounds coordinates: just under 1
        best, info = env.step_text(state, env.sft_target(state.meta))[2::2]
        assert plain > 0.9999 and best == pytest.approx(weight + (1 - weight) * plain)
        assert info["think_format_ok"] and info["format_ok"] and info["answer_reward"] == plain
        assert info["reward_components"][think.COMPONENT] == pytest.approx(weight)
        # the right answer without the tags: no answer block, so nothing to score, and no structure
        bare, info = env.step_text(state, ideal)[2::2]
        assert bare == 0.0 and not info["think_format_ok"] and not info["format_ok"]
        # the right answer block, but text after it: the answer's share only
        untidy, info = env.step_text(state, f"<think>hm</think><answer>{ideal}</answer> I am sure.")[2::2]
        assert untidy == pytest.approx((1 - weight) * plain) and not info["format_ok"]
        # the structure around a wrong answer: the structure's share plus whatever the env gives the answer
        wrong, info = env.step_text(state, "<think>hm</think><answer>zzz</answer>")[2::2]
        assert wrong == pytest.approx(weight + (1 - weight) * info["answer_reward"]) and info["answer_reward"] < plain
        assert info["answer_reward"] == off.step_text(state, "zzz")[2]


@pytest.mark.parametrize("name", BUILTIN)
def test_sft_target_wraps_the_ideal_answer_only_when_on(name):
    on, off = _env(name, on=True), _env(name, on=False)
    meta = off.reset(0)[0].meta
    assert off.sft_target(meta) == off.ideal_answer(meta)
    assert on.sft_target(meta) == f"<think>\n</think>\n<answer>\n{off.ideal_answer(meta)}\n</answer>"


def test_off_by_default_and_set_per_env_in_params():
    for name in BUILTIN:
        assert envs.env_class(name).Params().think is False
    section = from_dict(EnvParams, {"name": "nlvr2", "nlvr2": {"think": True, "think_format_weight": 0.2}})
    assert section.settings().think is True and section.settings().think_format_weight == 0.2
    with pytest.raises(ParamsError, match="think_format_weight"):
        from_dict(EnvParams, {"name": "digits", "digits": {"think": True, "think_format_weight": 1.5}})


ADVERSARIAL = ["", "<think>", "</answer>", "<answer></answer>" * 1000, "<think>" * 5000 + "<answer>1</answer>",
               "<answer>" + "9" * 100_000 + "</answer>", "<think>\x00</think><answer>\ud800</answer>",
               "<ANSWER>1</ANSWER>", "<think>x</think><answer>nan</answer>", "<answer><answer>1</answer></answer>"]


@pytest.mark.parametrize("name", BUILTIN)
def test_fuzz_think_rewards_stay_in_range_and_never_raise(name):
    env = _env(name)
    states = [env.reset(i)[0] for i in range(len(env))]
    rng = random.Random(0)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", "True", "False", "1, 2", "7", "Country: France",
              "\n", " ", "{", "}", "<", ">", "é", "数", "-3.5", "Latitude: 48.1"]
    texts = list(ADVERSARIAL)
    while len(texts) < 3000:
        texts.append("".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))))
    for i, text in enumerate(texts):
        reward, info = env.step_text(states[i % len(states)], text)[2::2]
        assert 0.0 <= reward <= 1.0 and isinstance(info["think_format_ok"], bool), text[:80]


@pytest.mark.parametrize("name", BUILTIN)
def test_junk_and_tags_in_the_answer_block_earn_no_answer_reward(name):
    env = _env(name)
    states = [env.reset(i)[0] for i in range(len(env))]
    texts = [*adversarial(name), *(f"<think>x</think><answer>{t}</answer>" for t in adversarial(name)[:60])]
    for state in states:
        ideal = env.ideal_answer(state.meta)
        # the right answer, but in a block that holds a tag, or only in the think block
        texts += [tagged(ideal) for tagged in TAGGED[:3]] + [f"<think>x</think><answer><think>{ideal}</think></answer>"]
    for i, text in enumerate(texts):
        info = env.step_text(states[i % len(states)], text)[4]
        assert info["answer_reward"] < 1e-3, (name, text[:80])  # not 0 for geospot: see its junk test
