"""What the end-to-end pipeline tests share: a fresh checkout of the repository and a checked subprocess."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# The order `dvc repro` runs the stages in under PYTHONHASHSEED=0 (micro_checkout's): DVC orders the stages that do
# not depend on each other (the data's and the base model's) by Python's per-process hash seed, so the tests fix it.
STAGES = ["download", "base_model", "convert", "shard", "sft", "train", "rollout", "export", "evaluate"]
# Top-level folders that only hold pipeline outputs (or local state): never copied into the fresh checkout.
OUTPUT_DIRS = ("data", "models", "outputs", "metrics", "reports", "checkpoints", "mlartifacts")


# A guard against a hung command, not a speed check: a micro `dvc repro` takes about 2 min alone on 2 quiet cores
# (113 s compiling everything, 87 s with every program in the compilation cache), about 3 in the suite, and over
# 10 on a machine shared with other jobs (a 600 s limit failed the session's pipeline fixture there).
COMMAND_TIMEOUT_S = 1800


def run_checked(args: list[str], cwd: Path, env: dict[str, str],
                timeout: int = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout[-4000:]}\n"
                             f"{result.stderr[-6000:]}")
    return result


def stages_run(output: str) -> list[str]:
    """Stage names in the order `dvc repro` ran them ("Running stage 'x':" lines; --dry prints the same)."""
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]


def fresh_checkout(dest: Path) -> None:
    """The repository's files as a clone would have them (tracked plus not-yet-committed, not ignored)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        if name.split("/", 1)[0] in OUTPUT_DIRS or name == "dvc.lock" or not (REPO / name).is_file():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest / name)


def micro_checkout(root: Path) -> dict[str, str]:
    """A fresh checkout in `root` (git and dvc initialised, the micro preset merged into params.yaml, nothing
    committed yet) and the environment its commands run in: this venv, its own MLflow store, no outer DVC."""
    from vlmgym.cli.presets import apply_preset

    fresh_checkout(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "VLMGYM_", "MLFLOW_"))}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(root / "src"),
               MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", GIT_AUTHOR_NAME="e2e", GIT_AUTHOR_EMAIL="e2e@x",
               GIT_COMMITTER_NAME="e2e", GIT_COMMITTER_EMAIL="e2e@x", PYTHONHASHSEED="0")
    run_checked(["git", "init", "-q"], root, env)
    if not (root / ".dvc").is_dir():
        run_checked(["dvc", "init", "-q"], root, env)
    apply_preset(root / "configs" / "micro.yaml", root / "params.yaml")
    return env


def env_pipeline(root: Path, overlay: dict) -> tuple[Path, dict[str, str], str]:
    """A micro checkout in `root` with `overlay` (e.g. another env.name) merged as a preset and committed, after
    one `dvc repro`: (root, the environment, the repro's output)."""
    import yaml

    env = micro_checkout(root)
    (root / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    run_checked(["vlmgym", "preset", "overlay.yaml", "--on-top"], root, env)
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "overlay"], root, env)
    # the micro run takes about 2 min on 2 quiet cores; the margin is for a machine shared with other jobs
    return root, env, run_checked(["dvc", "repro"], root, env).stdout


def read_records(path: Path) -> list[dict]:
    """The records of a JSON-lines file."""
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def output_digests(root: Path) -> dict[str, str]:
    """md5 of every file under every stage output of dvc.yaml (outs, metrics, plots), by path from `root`."""
    import yaml

    paths = set()
    for stage in yaml.safe_load((root / "dvc.yaml").read_text())["stages"].values():
        for entry in stage.get("outs", []) + stage.get("metrics", []) + stage.get("plots", []):
            paths.add(entry if isinstance(entry, str) else next(iter(entry)))
    files = []
    for path in map(root.joinpath, sorted(paths)):
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {f.relative_to(root).as_posix(): hashlib.md5(f.read_bytes()).hexdigest() for f in files}


def copy_of(pipeline: dict, dest: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the shared pipeline checkout at `dest` (outputs, DVC cache, checkpoints, MLflow store), and the
    environment its commands run in: the copy's own code and MLflow store."""
    shutil.copytree(pipeline["root"], dest, symlinks=True)
    env = {**pipeline["env"], "PYTHONPATH": str(dest / "src"), "MLFLOW_TRACKING_URI": f"sqlite:///{dest / 'mlflow.db'}"}
    return dest, env
