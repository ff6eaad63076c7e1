"""`vlmgym bench compile-cache` on a one-stage DVC checkout: three conditions timed, the programs the stage kept
counted, and a stage whose output changes from run to run caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vlmgym.bench import compile_cache as bench

pytestmark = pytest.mark.slow

STAGE = textwrap.dedent("""
    import os, sys, time
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # keep even this small program
    assert not os.path.exists("checkpoints"), "a run of the benchmark found checkpoints to resume"
    from vlmgym.runtime import compile_cache
    compile_cache.enable()
    import jax, jax.numpy as jnp
    def gram_tanh(x):
        return jnp.tanh(x @ x.T).sum()
    value = float(jax.jit(gram_tanh)(jnp.ones((32, 32))))
    extra = f" {time.time()}" if sys.argv[1:] == ["changing"] else ""
    open("out.txt", "w").write(f"{value}{extra}")
""")


def _checkout(root: Path, *args: str) -> Path:
    root.mkdir()
    (root / "stage.py").write_text(STAGE)
    (root / "dvc.yaml").write_text(json.dumps({"stages": {"compute": {
        "cmd": " ".join([sys.executable, "stage.py", *args]), "deps": ["stage.py"], "outs": ["out.txt"]}}}))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "repro", "-q"]):
        subprocess.run(command, cwd=root, env=env, check=True, capture_output=True)
    return root


def test_off_empty_and_warm_are_timed_from_step_0_with_the_same_outputs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    repo = _checkout(tmp_path / "repo")
    (repo / "checkpoints").mkdir()
    (repo / "checkpoints" / "kept").write_text("a training run's resume point")
    assert bench.main(["--repo", str(repo), "--repeats", "1"]) == 0
    assert (repo / "checkpoints" / "kept").read_text() == "a training run's resume point"  # put back
    out = json.loads(capsys.readouterr().out)
    assert set(out["runs_s"]) == {"off", "empty", "warm"} and all(len(v) == 1 for v in out["runs_s"].values())
    assert out["programs_kept"] >= 1  # the stage's jitted program, written by the `empty` run
    assert out["speedup_vs_off"]["warm"] == round(out["median_s"]["off"] / out["median_s"]["warm"], 2)


def test_a_stage_whose_outputs_change_is_caught(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    repo = _checkout(tmp_path / "repo", "changing")
    with pytest.raises(SystemExit, match="cache off changed an output's hash"):
        bench.main(["--repo", str(repo), "--repeats", "1"])


def test_a_checkout_that_never_ran_is_named(tmp_path):
    with pytest.raises(SystemExit, match="has no dvc.lock"):
        bench.main(["--repo", str(tmp_path), "--repeats", "1"])
