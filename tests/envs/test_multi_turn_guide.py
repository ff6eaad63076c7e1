"""docs/multi-turn.md: its example is tests/envs/mirror_env.py word for word, and the plug-in's tool works in an
episode, in SFT's turns and in its settings; the guide's command names a preset that exists."""

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import ImageOps

from vlmgym import envs
from vlmgym.config import ParamsError
from vlmgym.envs import multiturn

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
