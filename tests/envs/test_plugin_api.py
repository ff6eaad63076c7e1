"""The plug-in API: both guides import vlmgym's names from one module, vlmgym.api, and those lines run; names
that moved keep their old path, which gives the new module and warns."""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest

import vlmgym.api
import vlmgym.envs
import vlmgym.params
import vlmgym.stats.bootstrap
import vlmgym.stats.plots

REPO = Path(__file__).resolve().parents[2]
GUIDES = ("writing-an-env.md", "multi-turn.md")
# old module path -> where it lives now
MOVED = {"vlmgym.eval.bootstrap": "vlmgym.stats.bootstrap", "vlmgym.eval.plots": "vlmgym.stats.plots"}


def vlmgym_imports(guide: str) -> list[str]:
    """The import statements of vlmgym in a guide's Python blocks (parenthesised ones joined onto one line)."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / guide).read_text(), re.S)
    assert blocks, f"docs/{guide} has no Python block"
    statements = re.findall(r"^(?:from vlmgym[\w.]* import (?:\([^)]*\)|.*)|import vlmgym[\w.]*.*)$",
                            "\n".join(blocks), re.M)
    return [" ".join(s.split()) for s in statements]


@pytest.mark.parametrize("guide", GUIDES)
def test_each_guide_imports_vlmgym_from_the_api_module_and_the_lines_run(guide):
    statements = vlmgym_imports(guide)
    assert statements, f"docs/{guide} imports nothing from vlmgym"
    assert all(s.startswith("from vlmgym.api import ") for s in statements), statements
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an import that works only through a deprecated path fails here
        for statement in statements:
            exec(statement, namespace)  # noqa: S102 -- the guide's own import lines
    names = {n.strip() for s in statements for n in s.split(" import ", 1)[1].strip("()").split(",") if n.strip()}
    assert names <= set(vlmgym.api.__all__)


def test_the_api_exports_the_homes_objects():
    """One object per name, wherever a guide or an older plug-in imported it from."""
    api = vlmgym.api
    assert api.spec is vlmgym.params.spec and api.ParamsError is vlmgym.params.ParamsError
    assert api.Env is vlmgym.envs.Env and api.make is vlmgym.envs.make and api.register is vlmgym.envs.register
    assert api.Statistic is vlmgym.stats.bootstrap.Statistic
    for name in api.__all__:
        assert getattr(api, name) is not None, name


def forget(monkeypatch, old: str) -> None:
    """Unload an alias module so that importing it runs (and warns) again."""
    monkeypatch.delitem(sys.modules, old, raising=False)
    package, _, leaf = old.rpartition(".")
    monkeypatch.delattr(importlib.import_module(package), leaf, raising=False)


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_a_moved_module_keeps_its_old_path_and_warns(monkeypatch, old, new):
    forget(monkeypatch, old)
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(old)} moved to {re.escape(new)}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_a_plug_in_written_against_the_old_path_loads_and_is_named_in_the_warning(monkeypatch, tmp_path):
    forget(monkeypatch, "vlmgym.eval.bootstrap")
    plugin = tmp_path / "old_plugin.py"
    plugin.write_text("from vlmgym.eval.bootstrap import Statistic\nfrom vlmgym.params import spec\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "old_plugin", raising=False)
    with pytest.warns(DeprecationWarning, match="vlmgym.stats.bootstrap") as caught:
        module = importlib.import_module("old_plugin")
    assert module.Statistic is vlmgym.api.Statistic and module.spec is vlmgym.api.spec
    assert [Path(w.filename) for w in caught if issubclass(w.category, DeprecationWarning)] == [plugin]


def test_spec_from_vlmgym_config_still_builds_fields_and_warns(tmp_path, monkeypatch):
    """Older guides imported `spec` from vlmgym.config: a plug-in's Params written so still validate."""
    plugin = tmp_path / "old_config_plugin.py"
    plugin.write_text("import dataclasses\nfrom vlmgym.config import spec\n\n@dataclasses.dataclass(frozen=True)\n"
                      "class Params:\n    size: int = spec(3, ge=1, doc='a size')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "old_config_plugin", raising=False)
    with pytest.warns(DeprecationWarning, match="import spec from vlmgym.api") as caught:
        module = importlib.import_module("old_config_plugin")
    assert [Path(w.filename) for w in caught if issubclass(w.category, DeprecationWarning)] == [plugin]
    with pytest.raises(vlmgym.api.ParamsError, match="size"):
        vlmgym.params.from_dict(module.Params, {"size": 0}, where="params.yaml: env.old")
