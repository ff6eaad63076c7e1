"""Stage processes collect cyclic garbage at a slower pace than Python's default (vlmgym.runtime.collector)."""

import ast
import gc
from pathlib import Path

import pytest

from vlmgym.runtime.collector import FIRST_GENERATION_THRESHOLD, collect_less

STAGES = sorted((Path(__file__).resolve().parents[2] / "stages").glob("*.py"))


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_only_the_first_generation_slows_and_never_speeds_up(thresholds):
    gc.set_threshold(700, 10, 10)
    collect_less()
    assert gc.get_threshold() == (FIRST_GENERATION_THRESHOLD, 10, 10)
    gc.set_threshold(5 * FIRST_GENERATION_THRESHOLD, 7, 3)
    collect_less()
    assert gc.get_threshold() == (5 * FIRST_GENERATION_THRESHOLD, 7, 3)


@pytest.mark.parametrize("script", STAGES, ids=lambda p: p.stem)
def test_every_stage_slows_the_collector_before_anything_else(script):
    main = next(node for node in ast.parse(script.read_text()).body
                if isinstance(node, ast.FunctionDef) and node.name == "main")
    first = main.body[1] if isinstance(main.body[0].value, ast.Constant) else main.body[0]  # after the docstring
    assert ast.unparse(first) == "collect_less()", script.name
