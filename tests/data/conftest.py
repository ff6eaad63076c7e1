"""Shared fixtures of the data tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_helpers import TINY_WORLD

from vlmgym.envs.geospot.synthetic import write_synthetic_raw


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory) -> Path:
    """A tiny synthetic world in the raw layout (built once per session; tests must not modify it)."""
    out = tmp_path_factory.mktemp("tiny_world") / "raw"
    write_synthetic_raw(TINY_WORLD, out)
    return out
