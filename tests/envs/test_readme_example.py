"""The README's "Write your own environment" example runs as written."""

import re
from pathlib import Path

from vlmgym.envs import registry

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    text = README.read_text()
    section = text.split("## Write your own environment", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section should hold exactly one python example"
    return blocks[0]


def test_readme_example_runs(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # keep "colour" out of other tests
    namespace = {"__name__": "readme_example"}
    exec(compile(readme_example(), str(README), "exec"), namespace)
    env = namespace["env"]
    assert "colour" in registry.names() and len(env) == 3
    state, obs = env.reset(1)
    assert obs["messages"][0]["content"][0] == {"type": "image"}
    assert env.step_text(state, "green")[2] == 1.0 and env.step_text(state, "red")[2] == 0.0
    assert namespace["PROMPT"] in registry.corpus()
