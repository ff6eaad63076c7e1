"""The README's "Write your own environment" example is tests/envs/colour_env.py, word for word, and it works."""

import re
from pathlib import Path

from vlmgym import envs
from vlmgym.envs import registry

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLE = Path(__file__).with_name("colour_env.py")


def readme_section() -> str:
    return README.read_text().split("## Write your own environment", 1)[1].split("\n## ", 1)[0]


def test_readme_shows_the_tested_module():
    blocks = re.findall(r"```python\n(.*?)```", readme_section(), re.S)
    assert blocks == [EXAMPLE.read_text()], "README example and tests/envs/colour_env.py differ"
    assert "dvc exp run $(.venv/bin/vlmgym recipe colour_env:ColourEnv --overrides)" in readme_section()


def test_the_example_plays_an_episode(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # keep "colour" out of other tests
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
