"""Every script under scripts/ imports only vlmgym modules and names that exist: a script the docs cite as the
command behind a number must still run on today's code (one that imported renamed helpers went unnoticed)."""
import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").rglob("*.py"))


def vlmgym_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) of each `from vlmgym... import name` and (module, None) of each `import vlmgym...`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vlmgym":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "vlmgym"]
    return found


def missing(module: str, name: str | None) -> bool:
    if importlib.util.find_spec(module) is None:
        return True
    if name is None or hasattr(importlib.import_module(module), name):
        return False
    try:  # a submodule imported by name
        return importlib.util.find_spec(f"{module}.{name}") is None
    except ModuleNotFoundError:  # `module` is a plain module, not a package
        return True


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_imports_exist(script):
    imports = vlmgym_imports(script)
    broken = [f"{module}.{name}" if name else module for module, name in imports if missing(module, name)]
    assert not broken, f"{script.relative_to(ROOT)} imports what vlmgym no longer has: {broken}"


def test_the_check_sees_a_missing_name(tmp_path):
    script = tmp_path / "old.py"
    script.write_text("from vlmgym.bench.common import no_such_helper\nimport vlmgym.no_such_module\n")
    assert [missing(m, n) for m, n in vlmgym_imports(script)] == [True, True]
