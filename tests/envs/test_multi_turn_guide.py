"""docs/multi-turn.md: its example is tests/envs/mirror_env.py word for word, and the plug-in's tool works in an
episode, in SFT's turns and in its settings; the guide's command names a preset that exists."""

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import ImageOps

from vlmgym import envs
from vlmgym.envs import multiturn
from vlmgym.envs.tools import tool_corpus
from vlmgym.models.qwen3_vl.base_model import train_tokenizer
from vlmgym.params import EnvParams, ParamsError, from_dict

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "multi-turn.md"
EXAMPLE = Path(__file__).with_name("mirror_env.py")
MIRROR = '<tool_call>\n{"name": "mirror", "arguments": {}}\n</tool_call>'


def test_guide_shows_the_tested_module_and_a_command_that_exists():
    text = GUIDE.read_text()
    assert re.findall(r"```python\n(.*?)```", text, re.S) == [EXAMPLE.read_text()]
    assert "vlmgym preset configs/zoom.yaml" in text and (REPO / "configs" / "zoom.yaml").is_file()
    assert "(docs/multi-turn.md)" in (REPO / "README.md").read_text()


@pytest.mark.usefixtures("scoped_envs")
def test_the_plug_in_tool_runs_in_an_episode():
    cls = envs.env_class("mirror_env:MirrorColourEnv")
    env = cls(samples=cls.generate(4, seed=0, split="train"))
    state, obs = env.reset(1)
    assert [tool["function"]["name"] for tool in obs["tools"]] == ["mirror"]
    state, reply, reward, done, info = env.step_text(state, MIRROR)
    assert (reward, done, info["tool_call"]["ok"]) == (0.0, False, True)
    np.testing.assert_array_equal(np.asarray(reply["images"][1]),
                                  np.asarray(ImageOps.mirror(obs["images"][0].convert("RGB"))))
    _, _, reward, done, info = env.step_text(state, state.meta["colour"])
    assert done and reward == 1.0 and info["turns"] == 2
    state, _ = env.reset(1)
    _, reply, _, done, _ = env.step_text(state, MIRROR.replace("{}", '{"side": "left"}'))
    assert not done and reply["messages"][-1]["content"][0]["text"] == "error: mirror takes no arguments, got side"
    turns = multiturn.sft_turns(env, *env.reset(1))
    assert [target for _, target in turns] == [MIRROR, env.ideal_answer(state.meta)]


@pytest.mark.usefixtures("scoped_envs")
def test_the_plug_in_settings_name_its_own_tools():
    cls = envs.env_class("mirror_env:MirrorColourEnv")
    samples = cls.generate(2, seed=0, split="train")
    both = cls(samples=samples, params=cls.Params(tools=("mirror", "zoom"), max_turns=3))
    assert [tool.name for tool in both.tools] == ["mirror", "zoom"]
    with pytest.raises(ParamsError, match="max_turns >= 2"):
        cls.Params(tools=("mirror",), max_turns=1)


def base_model_stage():
    spec = importlib.util.spec_from_file_location("base_model_stage", REPO / "stages" / "base_model.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    return stage


@pytest.mark.usefixtures("scoped_envs")
def test_the_base_model_tokenizer_learns_the_plug_in_tool():
    tool_texts = base_model_stage().tool_texts
    texts = tool_texts(EnvParams(name="mirror_env:MirrorColourEnv"))
    mirror = envs.env_class("mirror_env:MirrorColourEnv").tool_classes["mirror"]()
    assert set(mirror.corpus()) < set(texts)
    both = from_dict(EnvParams, {"name": "mirror_env:MirrorColourEnv",
                                 "mirror_colour": {"tools": ["mirror", "zoom"], "max_turns": 3}}, where="p: env")
    assert tool_texts(both) == tool_corpus(("mirror", "zoom"), {"mirror": type(mirror),
                                                                "zoom": multiturn.BUILTIN_TOOLS["zoom"]})
    assert tool_texts(EnvParams()) == []  # the default env has no tools: its tokenizer is as before
    mixture = from_dict(EnvParams, {"name": "mixture", "mixture": {"envs": {"rec": 1, "digits": 1}},
                                    "digits": {"tools": ["zoom"], "max_turns": 2}}, where="p: env")
    assert tool_texts(mixture) == tool_corpus(("zoom",))  # each sub-env's own tools
    # learned, a call takes fewer tokens than from the environments' texts alone
    call = multiturn.call_text("mirror", {})
    corpus = envs.corpus(active="mirror_env:MirrorColourEnv")
    assert len(train_tokenizer(corpus + texts).tokenize(call)) < len(train_tokenizer(corpus).tokenize(call))


def test_the_guide_counts_a_zoom_call_in_tiny_tokens():
    # the per-turn token budget: 36 tokens plus one per digit of the box, 48 for the episode's example, at most 50
    tokenizer = train_tokenizer(envs.corpus(active="digits") + tool_corpus(("zoom",)))
    example = re.search(r"```\n(<tool_call>.*?</tool_call>)\n```", GUIDE.read_text(), re.S).group(1)
    assert len(tokenizer.tokenize(example)) == 48
    for box in ({"x1": 0, "y1": 0, "x2": 5, "y2": 5}, {"x1": 999, "y1": 999, "x2": 1000, "y2": 1000}):
        digits = sum(len(str(value)) for value in box.values())
        assert len(tokenizer.tokenize(multiturn.call_text("zoom", box))) == 36 + digits <= 50
    assert "a zoom call is 36 tokens plus one per digit of its box: 48" in " ".join(GUIDE.read_text().split())
