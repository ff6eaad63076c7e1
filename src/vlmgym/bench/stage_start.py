"""`vlmgym bench stage-start`: seconds from a stage's process start to the start of its work, per stage.

Runs each stage command of a checkout's dvc.yaml (`python stages/<name>.py ...`) the way DVC runs it, but stops it
where its work begins: at the body of its MLflow stage run (vlmgym.tracking.stage_runs.stage_run), after the
imports, the params and whatever the stage reads before it. Nothing is written but a FAILED run in a scratch MLflow
store. Give two checkouts (`--repo A --repo B`) to compare them: their runs alternate (A B A B ...), each stage's
median is printed with the ratio A/B. A checkout needs its pipeline's inputs in place (a finished `dvc repro`, or
`dvc checkout` from the cache), as the stages read them before their work.

    vlmgym bench stage-start [--repo DIR ...] [--repeats 3] [--stages sft train ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import yaml

# Runs one stage script in a fresh interpreter; prints {"start_s": ...} when the stage's MLflow run body starts.
CHILD = textwrap.dedent("""
    import contextlib, json, runpy, sys, time
    import psutil
    from vlmgym.tracking import stage_runs

    class WorkStarts(Exception):
        pass

    real = stage_runs.stage_run

    @contextlib.contextmanager
    def stopping(*args, **kwargs):
        with real(*args, **kwargs) as run:
            start = time.time() - psutil.Process().create_time()
            print(json.dumps({"start_s": round(start, 3)}), flush=True)
            raise WorkStarts
        yield run

    stage_runs.stage_run = stopping
    script, *argv = sys.argv[1:]
    sys.argv = [script, *argv]
    try:
        runpy.run_path(script, run_name="__main__")
    except WorkStarts:
        sys.exit(0)
    sys.exit("the stage ended without starting an MLflow stage run")
""")


def stage_commands(repo: Path, only: list[str] | None) -> dict[str, list[str]]:
    """{stage: [script, args...]} of dvc.yaml's plain stages (`python SCRIPT ...`), in file order."""
    stages = (yaml.safe_load((repo / "dvc.yaml").read_text()) or {}).get("stages", {})
    out = {}
    for name, spec in stages.items():
        words = shlex.split(spec.get("cmd", "")) if isinstance(spec.get("cmd"), str) else []
        if len(words) >= 2 and words[0] == "python" and (only is None or name in only):
            out[name] = words[1:]
    missing = set(only or ()) - set(out)
    if missing:
        raise SystemExit(f"vlmgym bench stage-start: {repo}/dvc.yaml has no python stage {sorted(missing)}")
    return out


def time_start(repo: Path, command: list[str], store: Path) -> float:
    """Seconds from the process start to the stage's work, for one run of `command` in `repo`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "VLMGYM_PIPELINE"))}
    env.update(PYTHONPATH=str(repo / "src"), MLFLOW_TRACKING_URI=f"sqlite:///{store / 'mlflow.db'}")
    done = subprocess.run([sys.executable, "-c", CHILD, *command], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"start_s"')]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"vlmgym bench stage-start: {' '.join(command)} in {repo} did not reach its work:\n{tail}")
    return json.loads(lines[-1])["start_s"]


def run(repos: list[Path], repeats: int, only: list[str] | None) -> dict:
    commands = {repo: stage_commands(repo, only) for repo in repos}
    names = [name for name in commands[repos[0]] if all(name in c for c in commands.values())]
    times: dict[Path, dict[str, list[float]]] = {repo: {name: [] for name in names} for repo in repos}
    with tempfile.TemporaryDirectory(prefix="vlmgym-bench-stage-start-") as tmp:
        stores = {repo: Path(tmp) / str(i) for i, repo in enumerate(repos)}
        for repo in repos:  # a first run creates each scratch store (its tables), which no stage pays in a pipeline
            stores[repo].mkdir()
            time_start(repo, commands[repo][names[0]], stores[repo])
        for _ in range(repeats):
            for name in names:
                for repo in repos:
                    times[repo][name].append(time_start(repo, commands[repo][name], stores[repo]))
    out: dict = {"machine": platform.platform(), "cores": os.cpu_count(), "repeats": repeats,
                 "repos": [str(r) for r in repos], "stages": {}}
    for name in names:
        row = {str(repo): {"median_s": round(statistics.median(times[repo][name]), 3), "runs_s": times[repo][name]}
               for repo in repos}
        if len(repos) == 2:
            row["ratio"] = round(row[str(repos[0])]["median_s"] / row[str(repos[1])]["median_s"], 2)
        out["stages"][name] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vlmgym bench stage-start", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, action="append", help="a checkout (give two to compare; default: .)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each stage per checkout")
    parser.add_argument("--stages", nargs="+", help="only these stages (default: every python stage)")
    args = parser.parse_args(argv)
    repos = [r.resolve() for r in (args.repo or [Path(".")])]
    if len(repos) > 2 or args.repeats < 1:
        parser.error("give at most two --repo and --repeats >= 1")
    print(json.dumps(run(repos, args.repeats, args.stages), indent=1))
    return 0
