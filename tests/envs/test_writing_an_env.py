"""docs/writing-an-env.md's example is tests/envs/colour_env.py, word for word, and it works."""

import re
from pathlib import Path

import pytest

from vlmgym import envs
from vlmgym.envs.registry import PLUGIN_DIR

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "writing-an-env.md"
EXAMPLE = Path(__file__).with_name("colour_env.py")


def guide() -> str:
    text = GUIDE.read_text()
    assert text.startswith("# Write your own environment\n")
    return text


def test_guide_shows_the_tested_module():
    blocks = re.findall(r"```python\n(.*?)```", guide(), re.S)
    assert blocks == [EXAMPLE.read_text()], "docs/writing-an-env.md's example and tests/envs/colour_env.py differ"
    # the command copies it into the plug-in folder, where the registry finds it by its name
    assert (f"cp tests/envs/colour_env.py {PLUGIN_DIR}/colour.py && .venv/bin/dvc exp run "
            "$(.venv/bin/vlmgym recipe colour --overrides)") in guide()


def test_readme_links_the_guide():
    assert "(docs/writing-an-env.md)" in (REPO / "README.md").read_text()


@pytest.mark.usefixtures("scoped_envs")
def test_the_example_plays_an_episode(monkeypatch):
    cls = envs.env_class("colour_env:ColourEnv")
    samples = cls.generate(6, seed=0, split="train")
    env = envs.make("colour", samples=samples)
    state, obs = env.reset(1)
    assert obs["messages"][0]["content"][0] == {"type": "image"} and len(obs["images"]) == 1
    truth = state.meta["colour"]
    assert env.step_text(state, truth.capitalize() + ".")[2] == 1.0
    wrong = next(c for c in ("red", "green") if c != truth)
    reward, info = env.score(state, wrong)
    assert reward == env.params.format_weight and info["reward_components"] == {"correct": 0.0, "format": 1.0}
    assert env.score(state, "a sort of teal")[0] == 0.0
    # the image really is the colour named in its row
    pixel = obs["images"][0].resize((1, 1)).getpixel((0, 0))
    assert max(range(3), key=lambda c: pixel[c]) == max(range(3), key=lambda c: cls_colour(truth)[c])


def cls_colour(name: str) -> tuple[int, int, int]:
    from colour_env import COLOURS

    return COLOURS[name]
