"""Every third-party package that the code imports is declared in pyproject.toml: runtime ones in
`dependencies` (for src/ and stages/), test-only ones in the `dev` extra (for tests/)."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]).lower()


def _imports(folder: Path) -> dict[str, Path]:
    """Top-level module names imported (absolutely) by the .py files under folder, with one file each."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path)
    return found


def _undeclared(folder: Path, declared: set[str]) -> list[str]:
    owners = metadata.packages_distributions()
    local = {p.stem for p in folder.rglob("*.py")} | {p.name for p in folder.rglob("*") if p.is_dir()}
    missing = []
    for module, path in _imports(folder).items():
        if module in sys.stdlib_module_names or module == "vlmgym" or module in local:
            continue
        distributions = {_name(d) for d in owners.get(module, [])}
        if not distributions & declared:
            missing.append(f"{module} (imported by {path.relative_to(folder)}; installed by {distributions or 'none'})")
    return missing


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    return runtime, runtime | {_name(r) for r in project["optional-dependencies"]["dev"]}


def test_the_package_and_stages_import_only_declared_dependencies():
    runtime, _ = _declared()
    assert _undeclared(REPO / "src", runtime) + _undeclared(REPO / "stages", runtime) == []


def test_the_tests_import_only_declared_dependencies():
    _, dev = _declared()
    assert _undeclared(REPO / "tests", dev) == []


def test_an_undeclared_import_is_found(tmp_path):
    (tmp_path / "uses_yaml.py").write_text("import yaml\nfrom PIL import Image\n")
    assert [m.split(" ")[0] for m in _undeclared(tmp_path, {"pillow"})] == ["yaml"]
