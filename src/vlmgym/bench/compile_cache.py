"""`vlmgym bench compile-cache`: a whole `dvc repro -f` with the compilation cache off, empty and warm.

Runs `dvc repro -f` (every stage) in a checkout whose pipeline can run, `--repeats` rounds of three runs in turn:
`off` (VLMGYM_COMPILE_CACHE=off: every program compiled in every stage), `empty` (a new cache folder: what a first
run on a machine gets, programs shared between stages load), `warm` (the folder `empty` just filled: a rerun after a
param change, a study's next arm). Every run trains from step 0: the checkout's `checkpoints/` is moved aside for the
benchmark (a finished training stage would otherwise resume at its end) and put back after it. Prints each run's
wall seconds, the medians and their ratios to `off`, and checks
that every run leaves the outputs' hashes in the checkout's dvc.lock as it found them: the same bytes, whatever the
cache.

    vlmgym bench compile-cache [--repo DIR] [--repeats 2] [--target STAGE_OR_DVC_FILE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

CONDITIONS = ("off", "empty", "warm")


def repro(repo: Path, cache: str, targets: list[str]) -> float:
    """Wall seconds of one `dvc repro -f` in `repo` with VLMGYM_COMPILE_CACHE=`cache`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DVC_", "VLMGYM_PIPELINE", "JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
    env.update(VLMGYM_COMPILE_CACHE=cache, PYTHONPATH=str(repo / "src"))
    started = time.perf_counter()
    done = subprocess.run(["dvc", "repro", "-f", *targets], cwd=repo, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise SystemExit(f"vlmgym bench compile-cache: dvc repro -f in {repo} failed (cache {cache}):\n{tail}")
    return seconds


def locks(repo: Path) -> dict[str, dict]:
    """The outputs' hashes in every dvc.lock under `repo` (outside .dvc and .git): {lock: {stage: {out: md5}}}.
    Only the outputs: a run records the checkout's code as it is in the deps, which may differ from the lock's."""
    out = {}
    for path in sorted(repo.rglob("dvc.lock")):
        if {".dvc", ".git"} & set(path.relative_to(repo).parts):
            continue
        stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})
        out[str(path.relative_to(repo))] = {name: {o["path"]: o.get("md5") for o in stage.get("outs", [])}
                                            for name, stage in stages.items()}
    return out


def cpu_model() -> str:
    """The CPU's model name as lscpu shows it ('' where /proc/cpuinfo does not say)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def run(repo: Path, repeats: int, targets: list[str]) -> dict:
    before = locks(repo)
    if not before:
        raise SystemExit(f"vlmgym bench compile-cache: {repo} has no dvc.lock: run `dvc repro` there once first")
    times: dict[str, list[float]] = {name: [] for name in CONDITIONS}
    checkpoints = repo / "checkpoints"
    with tempfile.TemporaryDirectory(prefix="vlmgym-bench-compile-cache-", dir=repo.parent) as tmp:
        kept = Path(tmp) / "checkpoints"
        if checkpoints.exists():
            checkpoints.rename(kept)
        try:
            for round_ in range(repeats):
                folder = Path(tmp) / str(round_)
                for name in CONDITIONS:
                    shutil.rmtree(checkpoints, ignore_errors=True)
                    times[name].append(round(repro(repo, "off" if name == "off" else str(folder), targets), 1))
                    if locks(repo) != before:
                        raise SystemExit(f"vlmgym bench compile-cache: the run with the cache {name} changed an "
                                         f"output's hash in a dvc.lock in {repo}: its outputs are not the same bytes")
                entries = len(list(folder.glob("*-cache")))
        finally:
            shutil.rmtree(checkpoints, ignore_errors=True)
            if kept.exists():
                kept.rename(checkpoints)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"machine": platform.platform(), "cpu": cpu_model(), "cores": os.cpu_count(),
            "repo": str(repo), "targets": targets, "repeats": repeats, "runs_s": times,
            "median_s": {name: round(value, 1) for name, value in medians.items()},
            "speedup_vs_off": {name: round(medians["off"] / medians[name], 2) for name in CONDITIONS[1:]},
            "programs_kept": entries,
            "outputs": "the same bytes in every run (the outputs' hashes in dvc.lock unchanged)"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vlmgym bench compile-cache", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path("."), help="a checkout whose `dvc repro` ran once")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of off, empty, warm")
    parser.add_argument("--target", action="append", default=[],
                        help="what `dvc repro -f` runs (a stage or a dvc.yaml; default: the checkout's pipeline)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    print(json.dumps(run(args.repo.resolve(), args.repeats, args.target), indent=1))
    return 0
