"""The micro pipeline run that several modules check (the end-to-end checks, the kill-and-rerun reference), built
once per test session whichever worker asks first (tests/shared_setup.py); no test changes
it: a test that reruns anything works in a copy (pipeline_helpers.copy_of)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_helpers import micro_checkout, output_digests, run_checked
from shared_setup import shared_across_workers


def _build(root: Path) -> dict:
    env = micro_checkout(root)
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "micro preset"], root, env)
    first = run_checked(["dvc", "repro"], root, env)
    digests = output_digests(root)
    text = {path: (root / path).read_text() for path in digests if path.endswith((".json", ".md", ".html"))}
    return {"root": str(root), "env": env, "first": first.stdout, "digests": digests, "text": text}


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory):
    """A fresh checkout with the micro preset after one full `dvc repro`, its environment, the repro's output
    and every output file's md5 and text. (The same outputs from scratch, byte for byte: tests/pipeline/
    test_kill_rerun.py.)"""
    built = shared_across_workers(tmp_path_factory, "micro-pipeline", _build)
    return {**built, "root": Path(built["root"])}
