"""The test tree's timing tables (tests/conftest.py) and the modules agree: every module the tables name exists, and a
module marks itself `slow` exactly when MODULE_SECONDS times it at SLOW_SECONDS or more."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TABLES = ("FIRST_HALF", "SECOND_HALF", "MODULE_SECONDS", "SLOW_SECONDS")


def _conftest_tables() -> dict:
    # Read as literals, not imported: under pytest "conftest" in sys.modules is whichever folder's was loaded last.
    tree = ast.parse((TESTS / "conftest.py").read_text())
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in TABLES}


def _marks_itself_slow(module: Path) -> bool:
    """Whether the module's top-level `pytestmark` (one mark or a list of them) holds `pytest.mark.slow`."""
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "pytestmark" for target in node.targets):
            return any(isinstance(part, ast.Attribute) and part.attr == "slow" and isinstance(part.value, ast.Attribute)
                       and part.value.attr == "mark" for part in ast.walk(node.value))
    return False


def test_every_module_the_tables_name_exists():
    tables = _conftest_tables()
    named = [*tables["FIRST_HALF"], *tables["SECOND_HALF"], *tables["MODULE_SECONDS"]]
    assert [name for name in named if not (TESTS / name).is_file()] == []


def test_a_module_marks_itself_slow_exactly_when_the_table_times_it_slow():
    tables = _conftest_tables()
    timed_slow = {name for name, seconds in tables["MODULE_SECONDS"].items() if seconds >= tables["SLOW_SECONDS"]}
    marked = {path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py") if _marks_itself_slow(path)}
    assert {"marked, timed under SLOW_SECONDS": sorted(marked - timed_slow),
            "timed slow, not marked": sorted(timed_slow - marked)} == {
        "marked, timed under SLOW_SECONDS": [], "timed slow, not marked": []}
