"""dvc.yaml's deps stay true both ways: every vlmgym module a stage can import is among its deps, no dep is code the
stage cannot import, and every dep exists.

"Can import" is the static closure of the stage script's `vlmgym` imports, function-level ones included (a lazy
import still runs the module), plus the built-in envs for stages that build an env by name (the registry imports
them from strings). Imports under `if TYPE_CHECKING:` never run and are left out, and so are those inside the
functions of the registered model's code (tracking/pyfunc_model.py): they run in the process that serves the model,
never in a stage (a stage only logs that file).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
DVC = yaml.safe_load((REPO / "dvc.yaml").read_text())


def module_file(name: str) -> Path | None:
    """The source file of a vlmgym module or package (None when it does not exist, e.g. a name in a module)."""
    base = SRC / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


SERVED_ONLY = SRC / "vlmgym" / "tracking" / "pyfunc_model.py"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
        if path == SERVED_ONLY and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {n for n in names if n == "vlmgym" or n.startswith("vlmgym.")}


def closure(script: Path) -> set[Path]:
    """Every vlmgym source file `script` can import, with each module's parent packages."""
    seen: set[Path] = set()
    todo = [script]
    while todo:
        for name in _imports(todo.pop()):
            parts = name.split(".")
            for end in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                path = module_file(".".join(parts[:end]))
                if path is not None and path not in seen:
                    seen.add(path)
                    todo.append(path)
                    if path.parent.name == "envs" and path.name == "registry.py":
                        from vlmgym.envs.registry import BUILTIN

                        builtin = {module_file(t.split(":")[0]) for t in BUILTIN.values()} - seen
                        seen.update(builtin)
                        todo.extend(builtin)
    return seen


def exact_deps(stage: str) -> list[str]:
    """The code deps stage `stage` should list: each file of its closure, or the highest folder above it whose every
    .py file is in the closure (one line for a whole package the stage uses)."""
    imported = closure(REPO / "stages" / f"{stage}.py")
    deps = set()
    for path in imported:
        while path.parent != SRC and all(f in imported for f in path.parent.rglob("*.py")):
            path = path.parent
        deps.add(path)
    return [f"stages/{stage}.py", *sorted(str(p.relative_to(REPO)) for p in deps)]


@pytest.mark.parametrize("stage", sorted(DVC["stages"]))
def test_stage_deps_cover_its_imports(stage):
    deps = [REPO / d for d in DVC["stages"][stage]["deps"]]
    code = [d for d in deps if d.is_relative_to(SRC) or d.is_relative_to(REPO / "stages")]  # the rest: outputs
    assert all(d.exists() for d in code), f"{stage}: deps that do not exist: {[d for d in code if not d.exists()]}"
    script = REPO / "stages" / f"{stage}.py"
    assert script in deps, f"{stage}: its own script is not a dep"
    missing = sorted(str(p.relative_to(REPO)) for p in closure(script)
                     if not any(p == d or d in p.parents for d in deps))
    assert not missing, f"dvc.yaml stage {stage!r} imports modules its deps do not list: {missing}"


@pytest.mark.parametrize("stage", sorted(DVC["stages"]))
def test_stage_deps_are_exactly_its_code(stage):
    """No dep a stage cannot import: an edit there would rerun the stage (and everything after it) for nothing."""
    listed = [d for d in DVC["stages"][stage]["deps"]
              if (REPO / d).is_relative_to(SRC) or (REPO / d).is_relative_to(REPO / "stages")]
    expected = exact_deps(stage)
    assert sorted(listed) == sorted(expected), (
        f"dvc.yaml stage {stage!r}: deps to add {sorted(set(expected) - set(listed))}, "
        f"to remove {sorted(set(listed) - set(expected))}")


def test_no_stage_depends_on_the_benchmarks():
    bench = SRC / "vlmgym" / "bench"
    for stage, spec in DVC["stages"].items():
        assert not any(bench == REPO / d or bench in (REPO / d).parents or REPO / d in bench.parents
                       for d in spec["deps"] if (REPO / d).is_relative_to(SRC)), stage


def builds_an_env(stage: str) -> bool:
    """Whether stage `stage` can import the env registry, which imports plug-ins by name (closure's logic)."""
    return SRC / "vlmgym" / "envs" / "registry.py" in closure(REPO / "stages" / f"{stage}.py")


@pytest.mark.parametrize("stage", sorted(DVC["stages"]))
def test_stages_that_build_an_env_depend_on_the_plugin_folder(stage):
    """A plug-in env in the project's folder is code the stage runs: editing it must rerun the stage, and a stage
    that builds no env must not rerun for it."""
    from vlmgym.envs.registry import PLUGIN_DIR

    # DVC stops on a dep that does not exist, so the folder is in git even without a plug-in
    assert (REPO / PLUGIN_DIR).is_dir() and any((REPO / PLUGIN_DIR).iterdir())
    assert (PLUGIN_DIR in DVC["stages"][stage]["deps"]) == builds_an_env(stage), (
        f"dvc.yaml stage {stage!r}: {'add' if builds_an_env(stage) else 'remove'} the dep {PLUGIN_DIR}")
