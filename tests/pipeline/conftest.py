"""The micro pipeline run that several modules check (the end-to-end checks, the kill-and-rerun reference), built
once per test session whichever worker asks first (tests/shared_setup.py); no test changes
it: a test that reruns anything works in a copy (pipeline_helpers.copy_of)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pipeline_helpers import micro_checkout, output_digests, run_checked, without_compilation_cache
from shared_setup import shared_across_workers


def _build(root: Path) -> dict:
    env = micro_checkout(root)
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "micro preset"], root, env)
    first = run_checked(["dvc", "repro"], root, env)
    digests = output_digests(root)
    # Text outputs as the first run left them.
    text = {path: (root / path).read_text() for path in digests if path.endswith((".json", ".md", ".html"))}
    # Everything again from scratch (no resume state, no compiled program from the first run): every output must
    # come back byte for byte, so the committed dvc.lock stays as it is.
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "first run"], root, env)
    shutil.rmtree(root / "checkpoints")
    forced = run_checked(["dvc", "repro", "-f"], root, without_compilation_cache(env))
    status = run_checked(["git", "status", "--porcelain"], root, env).stdout
    return {"root": str(root), "env": env, "first": first.stdout, "digests": digests, "text": text,
            "forced": forced.stdout, "forced_digests": output_digests(root), "git_status_after_forced": status}


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory):
    """A fresh checkout with the micro preset after one full `dvc repro`, its environment, the repro's output
    and every output file's md5 and text as that first run left them; then the first run committed, the checkpoints
    removed and `dvc repro -f`: its output, every output file's md5 and `git status` after it."""
    built = shared_across_workers(tmp_path_factory, "micro-pipeline", _build)
    return {**built, "root": Path(built["root"])}
