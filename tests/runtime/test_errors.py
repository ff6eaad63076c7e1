"""A user's error ends a stage or a `vlmgym` command with one line on stderr (what, where, the fix) and status 2;
VLMGYM_DEBUG=1 adds the traceback; a bug keeps its traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
VLMGYM = Path(sys.executable).parent / "vlmgym"


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("VLMGYM_DEBUG", "DVC_ROOT", "MLFLOW_TRACKING_URI")}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**environ, "JAX_PLATFORMS": "cpu", **env})


def stage(name: str, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return run([sys.executable, str(REPO / "stages" / f"{name}.py"), *args], cwd, **env)


def harness(body: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`body` defines main(); it runs through the wrapper as a stage named train would."""
    code = "import sys\nfrom vlmgym.runtime.errors import guarded\n" + textwrap.dedent(body) + \
        "\nsys.exit(guarded('train', main))\n"
    return run([sys.executable, "-c", code], cwd, **env)


# Progress a stage logs before it fails (MLflow creating its store, a stage's INFO lines): not part of the error.
PROGRESS = re.compile(r"^(\d{4}/\d\d/\d\d \S+ )?INFO ")


def one_line(result: subprocess.CompletedProcess) -> str:
    """The error's line: status 2, and stderr holds that line alone besides INFO progress logs."""
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if not PROGRESS.match(line)]
    assert len(lines) == 1 and result.stderr.splitlines()[-1] == lines[0], result.stderr
    return lines[0]


def params_with(tmp_path: Path, name: str, edit) -> Path:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    edit(raw)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_bad_params_value_is_one_line_naming_the_key_and_the_fix(tmp_path):
    bad = params_with(tmp_path, "lr.yaml", lambda raw: raw["train"]["optimizer"].update(lr="abc"))
    line = one_line(stage("train", tmp_path, "--params", bad.name))
    assert line.startswith("train: error: lr.yaml")
    assert "train.optimizer.lr" in line and "'abc'" in line and "dvc exp run -S" in line


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path):
    (tmp_path / "broken.yaml").write_text("data:\n  samples: 10\ntrain:\n  optimizer: [\n")
    line = one_line(stage("download", tmp_path, "--params", "broken.yaml"))
    assert line.startswith("download: error: broken.yaml, line 5, column 1: invalid YAML (")
    assert line.endswith("fix the syntax there")


def test_the_vlmgym_command_says_a_yaml_error_in_one_line_too(tmp_path):
    (tmp_path / "broken.yaml").write_text("train: {optimizer: [}\n")
    line = one_line(run([str(VLMGYM), "params", "broken.yaml"], tmp_path))
    assert line.startswith("vlmgym params: error: broken.yaml, line 1, column 21: invalid YAML")


def test_a_missing_input_path_is_one_line_naming_it_and_the_stage_that_writes_it(tmp_path):
    bad = params_with(tmp_path, "noraw.yaml", lambda raw: raw["data"].update(raw_dir="data/absent"))
    line = one_line(stage("shard", tmp_path, "--params", bad.name))
    assert line == "shard: error: data/absent/train.csv: missing; run the download stage first"


def test_a_missing_file_named_by_the_os_is_one_line_with_its_path(tmp_path):
    line = one_line(harness("def main():\n    open('checkpoints/none/state.json')", tmp_path))
    assert line.startswith("train: error: no such file or directory: checkpoints/none/state.json: run the stage")


def test_a_full_disk_names_the_folder_written_and_the_setting_to_move(tmp_path):
    # /dev/full fails every write with ENOSPC, as a full disk does: the write names no file, the frame does.
    (tmp_path / "checkpoints" / "train").mkdir(parents=True)
    (tmp_path / "checkpoints" / "train" / "state.bin").symlink_to("/dev/full")
    body = """
    from pathlib import Path

    def save(folder):
        with open(folder / "state.bin", "wb") as f:
            f.write(b"x" * 100)

    def main():
        try:
            save(Path("checkpoints/train"))
        except OSError as err:  # a checkpointer that wraps the OS's error in its own
            raise RuntimeError("could not save the checkpoint") from err
    """
    line = one_line(harness(body, tmp_path))
    assert line.startswith("train: error: no space left on device under checkpoints/train (")
    assert "move train.checkpointing.dir to a larger one" in line


def test_an_unreachable_tracking_server_is_one_line_naming_it(tmp_path):
    body = """
    def main():
        from mlflow.tracking import MlflowClient
        MlflowClient("http://127.0.0.1:9").search_experiments()
    """
    line = one_line(harness(body, tmp_path, MLFLOW_TRACKING_URI="http://127.0.0.1:9",
                            MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="2"))
    assert line.startswith("train: error: the MLflow tracking server http://127.0.0.1:9 did not answer ([Errno")
    assert "vlmgym tracking sync" in line


def test_an_error_class_marked_as_the_users_is_its_own_message(tmp_path):
    body = """
    class NonFinite(ArithmeticError):
        user_error = True

    def main():
        raise NonFinite("step 7: the loss is nan: lower train.optimizer.lr")
    """
    assert one_line(harness(body, tmp_path)) == "train: error: step 7: the loss is nan: lower train.optimizer.lr"


def test_vlmgym_debug_prints_the_traceback_before_the_line(tmp_path):
    bad = params_with(tmp_path, "lr.yaml", lambda raw: raw["train"]["optimizer"].update(lr="abc"))
    result = stage("train", tmp_path, "--params", bad.name, VLMGYM_DEBUG="1")
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr and "ParamsError" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("train: error: lr.yaml")


def test_a_bug_keeps_its_traceback(tmp_path):
    result = harness("def main():\n    return {}['missing']", tmp_path)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "KeyError: 'missing'" in result.stderr
    assert "error:" not in result.stderr
