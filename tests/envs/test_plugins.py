"""The plug-in interface: where a task lives, how env names resolve, and what each env provides the pipeline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vlmgym import envs
from vlmgym.envs import registry
from vlmgym.envs.base import MissingPart

SRC = Path(__file__).resolve().parents[2] / "src" / "vlmgym"


def test_no_module_outside_envs_names_an_env():
    # The pipeline asks the env's plug-in; only envs/ (and bench/, whose benchmarks measure one named workload
    # and which no stage imports: tests/project/test_dvc_deps.py) may name a task.
    # Names as words, not inside others ('record' and 'recipe' hold 'rec'); an underscore or a digit still joins a
    # word to a name ('geospot_score' names geospot).
    pattern = re.compile(rf"(?<![a-z])(?:{'|'.join(registry.BUILTIN)})(?![a-z])", re.IGNORECASE)
    offenders = [f"{path.relative_to(SRC)}:{number}"
                 for path in sorted(SRC.rglob("*.py")) if path.relative_to(SRC).parts[0] not in ("envs", "bench")
                 for number, line in enumerate(path.read_text().splitlines(), start=1) if pattern.search(line)]
    assert not offenders, f"env names outside envs/: {offenders}"


# mixture is made of the others: it has no data of its own (tests/envs/test_mixture.py)
@pytest.mark.parametrize("name", sorted(set(registry.BUILTIN) - {"mixture"}))
def test_builtin_envs_provide_the_whole_interface(name):
    cls = envs.env_class(name)
    assert cls.name == name and cls.schema is not None and cls.schema.name == name and cls.metric_rows
    samples = cls.generate(3, seed=1, split="test")
    # one image per extension; an env whose rows may show fewer (user_data: 1 to 4) at least schema.min_images
    least = cls.schema.min_images or len(cls.schema.image_exts)
    assert len(samples) == 3 and all(least <= len(s.images) <= len(cls.schema.image_exts) for s in samples)
    assert cls.generate(3, seed=1, split="test")[0].meta == samples[0].meta  # deterministic given the seed
    env = cls(samples=samples)
    state, _ = env.reset(0)
    _, _, best, _, info = env.step_text(state, env.ideal_answer(state.meta))
    _, _, garbage, _, garbage_info = env.step_text(state, "\x00 perhaps {{")
    assert best > garbage and info["format_ok"] and not garbage_info["format_ok"]
    # the report draws each reward level from the components the trainer logs
    declared = {c for pair in cls.reward_levels.values() for c in pair if c is not None}
    assert declared <= set(info["reward_components"]) and declared <= set(garbage_info["reward_components"])


@pytest.mark.usefixtures("scoped_envs")
def test_module_class_names_resolve_and_register(monkeypatch):
    cls = envs.env_class("colour_env:ColourEnv")  # tests/envs is on sys.path here
    assert cls.name == "colour" and envs.env_class("colour") is cls and "colour" in envs.names()
    with pytest.raises(ImportError, match="cannot load 'no_such_module:Env'"):
        envs.env_class("no_such_module:Env")
    with pytest.raises(TypeError, match="not an Env subclass"):
        envs.env_class("pathlib:Path")


@pytest.mark.usefixtures("scoped_envs")
def test_entry_points_register_envs(tmp_path, monkeypatch):
    dist = tmp_path / "colour_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: colour-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[vlmgym.envs]\npaint = colour_env:ColourEnv\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "paint" in envs.names() and registry.is_known("paint")
    assert envs.env_class("paint").name == "colour"


@pytest.mark.usefixtures("scoped_envs")
def test_the_tokenizer_corpus_holds_the_builtins_and_the_active_env(monkeypatch):
    builtin = envs.corpus()
    assert envs.corpus(active="geospot") == builtin  # a built-in env adds nothing twice
    with_colour = envs.corpus(active="colour_env:ColourEnv")
    assert with_colour[: len(builtin)] == builtin and "What colour is this image? Answer with one word." in with_colour


def test_a_minimal_env_says_which_part_a_stage_lacks():
    class Minimal(envs.Env):
        name = "minimal"

        def prompt(self, sample):
            return "?"

        def score(self, state, text):
            return 0.0, {}

    with pytest.raises(MissingPart, match="'minimal' has no ideal_answer"):
        Minimal(samples=envs.env_class("nlvr2").generate(1)).ideal_answer({})
    with pytest.raises(ValueError, match="'minimal' declares no row schema"):
        Minimal.generate(2)
    with pytest.raises(MissingPart, match="no embedded generator"):
        Minimal.write_synthetic(None, Path("unused"))
    with pytest.raises(MissingPart, match="no public dataset loader"):
        Minimal.download_hub(None, Path("unused"))
