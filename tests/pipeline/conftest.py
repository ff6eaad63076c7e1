"""The micro pipeline run that several modules check (the end-to-end checks, the kill-and-rerun reference)."""

from __future__ import annotations

import shutil

import pytest
from pipeline_helpers import micro_checkout, output_digests, run_checked, without_compilation_cache


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory):
    """A fresh checkout with the micro preset after one full `dvc repro`, its environment, the repro's output
    and every output file's md5 and text as that first run left them; then the first run committed, the checkpoints
    removed and `dvc repro -f`: its output, every output file's md5 and `git status` after it (later tests
    change the checkout)."""
    root = tmp_path_factory.mktemp("pipeline")
    env = micro_checkout(root)
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "micro preset"], root, env)
    first = run_checked(["dvc", "repro"], root, env)
    digests = output_digests(root)
    # Text outputs as the first run left them (the checkout changes later).
    text = {path: (root / path).read_text() for path in digests if path.endswith((".json", ".md", ".html"))}
    # Everything again from scratch (no resume state, no compiled program from the first run): every output must
    # come back byte for byte, so the committed dvc.lock stays as it is.
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "first run"], root, env)
    shutil.rmtree(root / "checkpoints")
    forced = run_checked(["dvc", "repro", "-f"], root, without_compilation_cache(env))
    status = run_checked(["git", "status", "--porcelain"], root, env).stdout
    return {"root": root, "env": env, "first": first.stdout, "digests": digests, "text": text,
            "forced": forced.stdout, "forced_digests": output_digests(root), "git_status_after_forced": status}
