"""Multi-turn episodes with visual tools: a zoom call gets the crop back and the episode goes on, bad calls get
an error reply, the last turn and turns that cannot go on are scored as the answer, and junk never raises."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from adversarial import JUNK

from vlmgym.envs import multiturn
from vlmgym.envs.digits import DigitsEnv
from vlmgym.envs.digits.env import DigitsParams
from vlmgym.envs.message_decoding import MessageDecodingEnv
from vlmgym.envs.mixture import MixtureEnv
from vlmgym.envs.tools import ToolCall, Zoom, parse_tool_call
from vlmgym.models.qwen3_vl.base_model import train_tokenizer
from vlmgym.models.qwen3_vl.chat import TOKEN_IDS
from vlmgym.params import EnvParams, ParamsError, from_dict

ZOOM = '<tool_call>\n{"name": "zoom", "arguments": {"x1": 0, "y1": 0, "x2": 500, "y2": 500}}\n</tool_call>'
SAMPLES = DigitsEnv.generate(4, seed=0)


def env(max_turns: int = 3, tools=("zoom",), tokenizer=None) -> DigitsEnv:
    return DigitsEnv(samples=SAMPLES, params=DigitsParams(tools=tools, max_turns=max_turns), tokenizer=tokenizer)


def one_turn_reward(text: str) -> float:
    single = DigitsEnv(samples=SAMPLES)
    return single.step_text(single.reset(1)[0], text)[2]


def test_the_first_observation_lists_the_tools_and_says_how_many_calls():
    state, obs = env().reset(1)
    assert obs["tools"] == [Zoom().schema()]
    assert obs["messages"][0]["content"][-1]["text"].endswith("You may call zoom up to 2 times before you answer.")
    assert state.extra["conversation"] is obs and state.extra["turn"] == 0
    _, single = DigitsEnv(samples=SAMPLES).reset(1)
    assert "tools" not in single


def test_a_zoom_call_shows_the_crop_and_the_answer_is_scored_as_in_one_turn():
    tools = env()
    state, obs = tools.reset(1)
    state, reply, reward, done, info = tools.step_text(state, f"Let me look. {ZOOM}")
    assert (reward, done) == (0.0, False)
    assert info["tool_call"] == {"turn": 0, "tool": "zoom", "ok": True, "error": None,
                                 "box": [0.0, 0.0, 500.0, 500.0], "reward": 0.0}
    assert [m["role"] for m in reply["messages"]] == ["user", "assistant", "tool"]
    assert reply["messages"][1] == {"role": "assistant", "content": f"Let me look. {ZOOM}"}
    assert len(reply["images"]) == 2 and reply["tools"] == obs["tools"]
    expected = Zoom().run({"x1": 0, "y1": 0, "x2": 500, "y2": 500}, obs["images"][0]).image
    np.testing.assert_array_equal(np.asarray(reply["images"][1]), np.asarray(expected))
    answer = tools.ideal_answer(state.meta)
    state, nothing, reward, done, info = tools.step_text(state, answer)
    assert done and nothing == [] and reward == one_turn_reward(answer) == 1.0
    assert info["turns"] == 2 and info["tool_errors"] == 0 and len(info["tool_calls"]) == 1


def test_a_bad_call_gets_the_error_as_the_reply_and_the_last_turn_is_the_answer():
    tools = env()
    state, _ = tools.reset(1)
    state, reply, _, done, info = tools.step_text(state, ZOOM.replace('"x2": 500', '"x2": -5'))
    assert not done and info["tool_call"]["ok"] is False
    assert reply["messages"][-1] == {"role": "tool", "content": [
        {"type": "text", "text": "error: zoom: x2 (-5) must be between 0 and 1000"}]}
    assert len(reply["images"]) == 1
    state, _, _, done, _ = tools.step_text(state, "<tool_call>{not json</tool_call>")
    assert not done and state.extra["turn"] == 2
    state, _, reward, done, info = tools.step_text(state, ZOOM)  # the third turn is the last: scored, not run
    assert done and reward == one_turn_reward(ZOOM) == 0.0
    assert info["turns"] == 3 and info["tool_errors"] == 2 and info["tool_call_after_last_turn"]


def test_token_ids_stay_with_the_turn_and_a_turn_that_cannot_go_on_is_the_answer():
    tokenizer = train_tokenizer([ZOOM, "1, 3, 7"], vocab_size=300)
    tools = env(tokenizer=tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [*tokenizer(ZOOM, add_special_tokens=False)["input_ids"], im_end]
    state, _ = tools.reset(1)
    after, reply, _, done, _ = tools.step(state, ids)
    assert not done and reply["messages"][1][TOKEN_IDS] == ids
    _, _, reward, done, info = tools.step(state, ids[:-1])  # cut at the length budget: no <|im_end|>
    assert done and reward == 0.0 and info["turns"] == 1
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert tools.step(state, [pad, *ids])[3]  # a sampled vision token ends the episode too


@pytest.mark.parametrize("text", JUNK[:24] + [ZOOM.replace("zoom", "crop"), "<tool_call>" * 3, ZOOM * 2, None])
def test_junk_never_raises_in_any_turn(text):
    tools = env()
    state, _ = tools.reset(2)
    for _ in range(3):
        state, _, reward, done, _ = tools.step_text(state, text)
        if done:
            break
    assert done and reward == 0.0


def test_settings_that_cannot_make_an_episode_are_refused():
    with pytest.raises(ParamsError, match="max_turns >= 2"):
        env(max_turns=1)
    with pytest.raises(ParamsError, match="tools is empty"):
        env(tools=())
    with pytest.raises(ParamsError, match="'crop' is not one of"):
        from_dict(EnvParams, {"name": "digits", "digits": {"tools": ["crop"], "max_turns": 2}})
    with pytest.raises(ParamsError, match=r"params.digits: tools \['zoom'\] need max_turns >= 2"):
        from_dict(EnvParams, {"name": "digits", "digits": {"tools": ["zoom"]}})
    with pytest.raises(ValueError, match="one-turn episodes"):
        MixtureEnv({"digits": env(), "message_decoding": MessageDecodingEnv(samples=MessageDecodingEnv.generate(2))})


def test_sft_teaches_the_ideal_zoom_then_the_answer():
    tools = env()
    state, obs = tools.reset(1)
    (first, call), (second, answer) = multiturn.sft_turns(tools, state, obs)
    assert first is obs and answer == tools.ideal_answer(state.meta)
    x1, y1, x2, y2 = state.meta["region"]
    assert parse_tool_call(call) == ToolCall("zoom", {"x1": x1, "y1": y1, "x2": x2, "y2": y2})
    assert call.startswith("<tool_call>\n{") and call.endswith("}\n</tool_call>")
    assert second["messages"][-1]["role"] == "tool" and len(second["images"]) == 2
    # the region holds every digit: the zoomed image is the region of the source at full size
    expected = Zoom().run({"x1": x1, "y1": y1, "x2": x2, "y2": y2}, obs["images"][0]).image
    np.testing.assert_array_equal(np.asarray(second["images"][1]), np.asarray(expected))
    # one-turn envs and data without regions: the answer alone
    single = DigitsEnv(samples=SAMPLES)
    assert [target for _, target in multiturn.sft_turns(single, *single.reset(1))] == [answer]
    no_region = [replace(s, meta={k: v for k, v in s.meta.items() if k != "region"}) for s in SAMPLES]
    plain = DigitsEnv(samples=no_region, params=DigitsParams(tools=("zoom",), max_turns=2))
    assert [target for _, target in multiturn.sft_turns(plain, *plain.reset(1))] == [answer]


def test_the_region_covers_the_digits_with_a_margin():
    from vlmgym.envs.digits import data as digits_data

    sample = digits_data.generate_split(0, "train", 1, 256, 192)[0]
    x1, y1, x2, y2 = sample.region(256, 192)
    for x, y, size, _ in sample.boxes:
        assert x1 <= x / 256 * 1000 and (x + size) / 256 * 1000 <= x2
        assert y1 <= y / 192 * 1000 and (y + size) / 192 * 1000 <= y2
    assert SAMPLES[1].meta["region"] == list(digits_data.generate_split(0, "train", 4, 256, 192)[1].region(256, 192))


def test_rec_teaches_a_zoom_around_the_object_and_answers_in_whole_image_coordinates():
    from vlmgym.envs.rec import RecEnv
    from vlmgym.envs.rec.env import RecParams

    samples = RecEnv.generate(3, seed=0)
    rec = RecEnv(samples=samples, params=RecParams(tools=("zoom",), max_turns=2))
    state, obs = rec.reset(0)
    x1, y1, x2, y2 = state.meta["bbox_2d"]
    (_, call), (second, answer) = multiturn.sft_turns(rec, state, obs)
    box = parse_tool_call(call).arguments
    assert box["x1"] <= x1 < x2 <= box["x2"] and box["y1"] <= y1 < y2 <= box["y2"]
    assert box["x2"] - box["x1"] <= 3 * (x2 - x1) + 1 and answer == rec.ideal_answer(state.meta)
    assert rec.step_text(state, call)[1]["images"][1].size == obs["images"][0].size
    assert RecEnv(samples=samples).ideal_tool_calls(state.meta) == []


def test_an_env_may_shape_each_call_and_the_episode_adds_it_up():
    class Strict(DigitsEnv):
        def turn_reward(self, call):
            return 0.0 if call["ok"] else -0.25

    strict = Strict(samples=SAMPLES, params=DigitsParams(tools=("zoom",), max_turns=3))
    state, _ = strict.reset(1)
    state, _, reward, done, _ = strict.step_text(state, "<tool_call>{not json</tool_call>")
    assert (reward, done) == (-0.25, False)
    state, _, _, _, _ = strict.step_text(state, ZOOM)
    answer = strict.ideal_answer(state.meta)
    _, _, reward, done, info = strict.step_text(state, answer)
    assert done and info["answer_reward"] == 1.0 and reward == 0.75
    assert [call["reward"] for call in info["tool_calls"]] == [-0.25, 0.0]


def test_the_tools_may_go_unlisted_for_a_model_that_learns_its_calls():
    quiet = DigitsEnv(samples=SAMPLES, params=DigitsParams(tools=("zoom",), max_turns=2, list_tools=False))
    state, obs = quiet.reset(1)
    assert "tools" not in obs
    assert obs["messages"][0]["content"][-1]["text"].endswith("call zoom once before you answer.")
    _, reply, _, done, _ = quiet.step_text(state, ZOOM)
    assert not done and "tools" not in reply and len(reply["images"]) == 2
