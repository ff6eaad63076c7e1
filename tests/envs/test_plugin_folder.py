"""The project's plug-in folder (vlmgym.envs.registry.PLUGIN_DIR): a plug-in env there is found by its file's name,
as the stages find it (the working directory is not on sys.path when `python stages/x.py` runs)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from vlmgym import envs
from vlmgym.envs import registry
from vlmgym.params import EnvParams

COLOUR_ENV = Path(__file__).resolve().parent / "colour_env.py"  # docs/writing-an-env.md's complete example


def _forget_plugin_modules() -> None:
    for module in [m for m in sys.modules if m == registry.PLUGIN_DIR or m.startswith(registry.PLUGIN_DIR + ".")]:
        del sys.modules[module]


@pytest.fixture
def plugins(tmp_path, monkeypatch, scoped_envs):
    """A project in tmp_path, the working directory, with an empty plug-in folder; the registry, sys.path and the
    imported plug-in modules are as they were after the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", os.fspath(tmp_path))])
    # a registered name or an entry point comes before the folder by design: another test in this process may have
    # used the example env under its name already
    monkeypatch.setattr(registry, "_entry_points", dict)
    monkeypatch.delitem(registry._REGISTRY, "colour", raising=False)
    _forget_plugin_modules()
    folder = tmp_path / registry.PLUGIN_DIR
    folder.mkdir()
    yield folder
    _forget_plugin_modules()


def test_a_plugin_module_is_found_by_its_file_name(plugins):
    shutil.copy(COLOUR_ENV, plugins / "colour.py")
    assert registry.plugin_names() == ["colour"]
    assert registry.is_known("colour") and "colour" in envs.names()
    cls = envs.env_class("colour")
    assert cls.name == "colour" and Path(sys.modules[cls.__module__].__file__) == (plugins / "colour.py").resolve()
    assert cls.__module__ == f"{registry.PLUGIN_DIR}.colour"
    # the explicit 'module:Class' form names the same class, and the env section's settings are the plug-in's
    assert envs.env_class(f"{registry.PLUGIN_DIR}.colour:ColourEnv") is cls
    assert EnvParams(name="colour").settings() == cls.Params()
    env = cls(samples=cls.generate(2, seed=0, split="test"))
    state, _ = env.reset(0)
    assert env.score(state, state.meta["colour"])[0] == 1.0


def test_a_plugin_package_is_found_by_its_folder_name(plugins):
    package = plugins / "paint"
    package.mkdir()
    (package / "task.py").write_text(COLOUR_ENV.read_text().replace('name = "colour"', 'name = "paint"'))
    (package / "__init__.py").write_text("from .task import ColourEnv\n")
    cls = envs.env_class("paint")
    assert cls.name == "paint" and cls.__module__ == f"{registry.PLUGIN_DIR}.paint.task"


def test_helpers_and_odd_names_in_the_folder_are_not_plugins(plugins):
    (plugins / "_shared.py").write_text("")
    (plugins / "my-env.py").write_text("")
    (plugins / "notes.md").write_text("")
    (plugins / "data").mkdir()  # a folder without __init__.py
    shutil.copy(COLOUR_ENV, plugins / "colour.py")
    assert registry.plugin_names() == ["colour"]
    with pytest.raises(KeyError, match=f"or add {registry.PLUGIN_DIR}/shapes.py"):
        envs.env_class("shapes")


def test_a_plugin_must_define_the_env_its_file_names(plugins):
    shutil.copy(COLOUR_ENV, plugins / "tint.py")  # its class is named "colour"
    with pytest.raises(ImportError, match=r"must define one Env subclass whose `name` is 'tint', it defines "
                                          r"ColourEnv \(name 'colour'\)"):
        envs.env_class("tint")
    (plugins / "broken.py").write_text("import no_such_module_anywhere\n")
    with pytest.raises(ImportError, match=r"cannot import the plug-in plugins/broken: No module named "
                                          "'no_such_module_anywhere'"):
        envs.env_class("broken")


def test_a_registered_name_wins_over_a_plugin_file(plugins):
    builtin = sorted(set(registry.BUILTIN) - {"mixture"})[0]
    (plugins / f"{builtin}.py").write_text(COLOUR_ENV.read_text().replace('name = "colour"', f'name = "{builtin}"'))
    assert envs.env_class(builtin).__module__.startswith("vlmgym.envs.")
