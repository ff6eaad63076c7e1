"""The micro pipeline run that several modules check (the end-to-end checks, the kill-and-rerun reference)."""

from __future__ import annotations

import pytest
from pipeline_helpers import micro_checkout, output_digests, run_checked


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory):
    """A fresh checkout with the micro preset after one full `dvc repro`, its environment, the repro's output
    and every output file's md5 as that first run left them (later tests change the checkout)."""
    root = tmp_path_factory.mktemp("pipeline")
    env = micro_checkout(root)
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "micro preset"], root, env)
    first = run_checked(["dvc", "repro"], root, env)
    digests = output_digests(root)
    # Text outputs as they were (the checkout changes later), for comparisons that mask measured speeds.
    text = {path: (root / path).read_text() for path in digests if path.endswith((".json", ".md", ".html"))}
    return {"root": root, "env": env, "first": first.stdout, "digests": digests, "text": text}
