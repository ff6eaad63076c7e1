"""MLflow stage runs: params, metrics and lineage tags, checked with MlflowClient on a temp SQLite store."""

import http.server
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from vlmgym.tracking import pipeline_run
from vlmgym.tracking import stage_runs as tracking

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent

STAGE_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from vlmgym.params import load_section
    from vlmgym.tracking.stage_runs import stage_run

    name = sys.argv[1]
    with stage_run(name, load_section("data")) as run:
        src = Path(sys.argv[2]) if len(sys.argv) > 2 else None
        text = src.read_text() if src else "seed"
        Path(f"{name}.out").write_text(text + "+" + name)
        if name == "first":
            Path("first.json").write_text('{"chars": %d}' % len(text))
        run.log_metrics({"chars": len(text), "bad": "not-a-number"})
    """
)


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "stage.py").write_text(STAGE_SCRIPT)
    (repo / "params.yaml").write_text("data:\n  seed: 3\ntracking:\n  experiment: unit\nsft:\n  mesh: [1, 2]\n")
    (repo / "data").mkdir()
    (repo / "data" / "words.txt").write_text("hello\n")
    # A metrics file a DVC stage writes, committed as a finished run leaves it: DVC deletes it before it runs the
    # stage, which git sees as a change.
    (repo / "first.json").write_text('{"chars": 4}')
    (repo / "dvc.yaml").write_text(textwrap.dedent(
        """
        stages:
          first:
            cmd: python stage.py first
            deps: [stage.py, data/words.txt]
            params: [data.seed]
            outs: [first.out]
            metrics:
              - first.json:
                  cache: false
          second:
            cmd: python stage.py second first.out
            deps: [stage.py, first.out]
            outs: [second.out]
        """
    ))
    run = lambda *a: subprocess.run(a, cwd=repo, check=True, capture_output=True, text=True)
    run("git", "init", "-q")
    run(str(BIN / "dvc"), "init", "-q")
    run(str(BIN / "dvc"), "config", "core.analytics", "false")
    run("git", "add", "-A")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return repo


@pytest.fixture(scope="module")
def repro(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("tracking")
    repo = make_repo(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop(tracking.PIPELINE_ID_ENV, None)
    first = subprocess.run([str(BIN / "dvc"), "repro"], cwd=repo, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr + first.stdout
    second = subprocess.run([str(BIN / "dvc"), "repro"], cwd=repo, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("unit")
    runs = client.search_runs([experiment.experiment_id])
    return repo, runs, second.stdout, client


def _stage_runs(runs):
    return [r for r in runs if r.data.tags.get(pipeline_run.ROLE_TAG) != pipeline_run.PIPELINE_ROLE]


def test_each_stage_is_one_run_with_params_and_metrics(repro):
    _, runs, _, _ = repro
    runs = _stage_runs(runs)
    assert sorted(r.data.tags["vlmgym.stage"] for r in runs) == ["first", "second"]
    for r in runs:
        assert r.data.params["seed"] == "3"
        assert r.data.metrics["chars"] > 0
        assert "bad" not in r.data.metrics
        assert r.info.status == "FINISHED"


def test_one_parent_run_holds_the_pipeline(repro):
    """Both stage runs nest under one parent run, which has every params section and finished."""
    _, runs, _, client = repro
    (parent,) = [r for r in runs if r.data.tags.get(pipeline_run.ROLE_TAG) == pipeline_run.PIPELINE_ROLE]
    stages = _stage_runs(runs)
    assert {r.data.tags[pipeline_run.PARENT_TAG] for r in stages} == {parent.info.run_id}
    assert parent.data.tags["vlmgym.pipeline_id"] == stages[0].data.tags["vlmgym.pipeline_id"]
    assert parent.data.params == {"data.seed": "3", "tracking.experiment": "unit", "sft.mesh": "[1, 2]"}
    assert parent.info.status == "FINISHED" and parent.info.run_name.startswith("pipeline-")
    # The parent's writer is the dvc process, which has exited, so a later stage would close it if it had
    # been left RUNNING; the stage runs' writers are the stage processes.
    assert parent.data.tags["vlmgym.writer"] not in {r.data.tags["vlmgym.writer"] for r in stages}
    # It names the run of each stage, both rerun here.
    by_stage = {r.data.tags["vlmgym.stage"]: r.info.run_id for r in stages}
    assert {stage: parent.data.tags[pipeline_run.STAGE_RUN_TAG + stage] for stage in by_stage} == by_stage
    assert {parent.data.tags[pipeline_run.STAGE_CACHED_TAG + stage] for stage in by_stage} == {"false"}
    # The pipeline's parents, as docs/pipeline.md queries them.
    import mlflow

    mlflow.set_tracking_uri(client.tracking_uri)
    table = mlflow.search_runs(experiment_names=["unit"], filter_string="tags.`vlmgym.role` = 'pipeline'")
    assert list(table["run_id"]) == [parent.info.run_id]


def test_data_dependencies_are_run_inputs_with_the_dvc_hash(repro):
    repo, runs, _, client = repro
    (first,) = [r for r in _stage_runs(runs) if r.data.tags["vlmgym.stage"] == "first"]
    (logged,) = client.get_run(first.info.run_id).inputs.dataset_inputs
    assert logged.dataset.name == "data/words.txt"
    assert logged.dataset.digest == first.data.tags["dvc.dep.data/words.txt"] == tracking.dvc_hash(
        repo / "data/words.txt")
    assert [t.value for t in logged.tags if t.key == "mlflow.data.context"] == ["first"]


def test_lineage_tags(repro):
    repo, runs, _, _ = repro
    by_stage = {r.data.tags["vlmgym.stage"]: r.data.tags for r in _stage_runs(runs)}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert by_stage["first"]["git.commit"] == commit
    # DVC deleted the committed first.json before the first stage and wrote dvc.lock and a .gitignore before the
    # second: the pipeline's own files, so a clean checkout is clean in both.
    assert (by_stage["first"]["git.dirty"], by_stage["second"]["git.dirty"]) == ("false", "false")
    assert "first.json" in subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True).stdout
    # Both stages of one `dvc repro` share a pipeline id, and it names the dvc process.
    assert by_stage["first"]["vlmgym.pipeline_id"] == by_stage["second"]["vlmgym.pipeline_id"]
    assert by_stage["first"]["vlmgym.pipeline_id"].startswith("dvc-")
    # The hashes agree with what DVC itself recorded in dvc.lock.
    lock = (repo / "dvc.lock").read_text()
    assert by_stage["second"]["dvc.dep.first.out"] in lock
    assert by_stage["first"]["dvc.out.first.out"] == by_stage["second"]["dvc.dep.first.out"]
    assert by_stage["second"]["dvc.out.second.out"] in lock
    assert by_stage["first"]["dvc.dep.stage.py"] in lock


def test_second_repro_runs_nothing(repro):
    _, runs, stdout, _ = repro
    assert len(runs) == 3  # two stages and their parent
    assert "didn't change, skipping" in stdout or "Data and pipelines are up to date" in stdout


def test_failed_stage_is_marked_failed_and_env_overrides(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv(tracking.PIPELINE_ID_ENV, "pipe-42")
    monkeypatch.setenv("DVC_EXP_NAME", "brisk-lamb")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    with pytest.raises(RuntimeError), tracking.stage_run("boom", {"a": 1}, experiment="failing"):
        raise RuntimeError("stage failed")
    client = MlflowClient(uri)
    (run,) = _stage_runs(client.search_runs([client.get_experiment_by_name("failing").experiment_id]))
    assert run.info.status == "FAILED"
    parent = client.get_run(run.data.tags[pipeline_run.PARENT_TAG])  # the pipeline failed with its stage
    assert parent.info.status == "FAILED" and parent.info.run_name == "brisk-lamb"
    assert parent.data.tags["dvc.exp_name"] == "brisk-lamb" and "vlmgym.writer" not in parent.data.tags
    assert run.data.tags["vlmgym.pipeline_id"] == "pipe-42"
    assert run.data.tags["dvc.exp_name"] == "brisk-lamb"
    assert run.info.run_name == "brisk-lamb/boom"


def test_tracking_section_comes_from_the_stage_params_file(tmp_path, monkeypatch):
    """A stage run with --params other.yaml logs to that file's experiment, not the repo's params.yaml one."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    (tmp_path / "params.yaml").write_text("tracking:\n  experiment: from-root\n")
    other = tmp_path / "other.yaml"
    other.write_text("tracking:\n  experiment: from-other\n")
    with tracking.stage_run("probe", {"a": 1}, params_file=other):
        pass
    client = MlflowClient(uri)
    assert client.get_experiment_by_name("from-root") is None
    (run,) = client.search_runs([client.get_experiment_by_name("from-other").experiment_id])
    assert run.info.run_name == "probe"


def test_dvc_hash_matches_dvc_for_files(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("hello\n")
    assert tracking.dvc_hash(path) == "b1946ac92492d2347c6235b4d2611184"
    assert tracking.dvc_hash(tmp_path / "missing") is None


def test_sample_table_is_an_artifact_folder(tmp_path, monkeypatch):
    import json as json_module

    from PIL import Image

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    rows = [{"index": 7, "images": [Image.new("RGB", (8, 8), "red"), Image.new("L", (8, 8))], "answer": "Red",
             "reward": 0.5, "reward_components": {"correct": 1.0}}]
    with tracking.stage_run("train", {"a": 1}, experiment="samples") as run:
        run.log_sample_table(3, rows)
    client = MlflowClient(uri)
    (logged,) = client.search_runs([client.get_experiment_by_name("samples").experiment_id])
    folder = Path(client.download_artifacts(logged.info.run_id, "samples/step_000003", str(tmp_path)))
    assert sorted(p.name for p in folder.iterdir()) == ["00_0.jpg", "00_1.jpg", "table.json"]
    assert json_module.loads((folder / "table.json").read_text()) == [
        {"index": 7, "images": ["00_0.jpg", "00_1.jpg"], "answer": "Red", "reward": 0.5,
         "reward_components": {"correct": 1.0}}]


def test_queued_experiments_log_to_the_repository_store(tmp_path, monkeypatch):
    """`dvc exp run --queue` runs stages in <repo>/.dvc/tmp/exps/<tmp>, deleted afterwards: the default store is
    the repository's, not one in that workspace."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    workspace = tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmpab12"
    monkeypatch.setenv("DVC_ROOT", str(workspace))
    assert tracking.repo_root() == workspace
    assert tracking.store_root() == tmp_path / "repo"
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path / 'repo' / 'mlflow.db'}"
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "repo"))
    assert tracking.store_root() == tmp_path / "repo"


def test_a_queued_experiment_is_one_parent_run_in_the_repository_store(tmp_path):
    """`dvc exp run --queue` + `dvc queue start`: the stages run in a temporary copy with the queued params, and
    log to the repository's store, nested under a parent named after the experiment."""
    import time

    repo = make_repo(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "DVC_", "VLMGYM_"))}
    env["PATH"] = f"{BIN}:{env['PATH']}"
    dvc = lambda *a: subprocess.run([str(BIN / "dvc"), *a], cwd=repo, env=env, capture_output=True, text=True,
                                    check=True, timeout=300).stdout
    dvc("exp", "run", "--queue", "-S", "data.seed=5", "-n", "queued5")
    dvc("queue", "start")
    deadline = time.monotonic() + 240
    while "queued5" not in dvc("exp", "show", "--no-pager", "--csv") or "Running" in dvc("queue", "status") \
            or "Queued" in dvc("queue", "status"):
        assert time.monotonic() < deadline, dvc("queue", "status")
        time.sleep(2)
    assert "Success" in dvc("queue", "status"), dvc("queue", "logs", "queued5")
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("unit").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get(pipeline_run.ROLE_TAG) == pipeline_run.PIPELINE_ROLE]
    assert parent.info.run_name == "queued5" and parent.info.status == "FINISHED"
    assert parent.data.params["data.seed"] == "5"  # the copy's params, not the repository's
    stages = _stage_runs(runs)
    assert sorted(r.info.run_name for r in stages) == ["queued5/first", "queued5/second"]
    baseline = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    identity = {"dvc.exp_name": "queued5", "dvc.exp_baseline_rev": baseline, "git.commit": baseline,
                "dvc.exp_ref": f"refs/exps/{baseline[:2]}/{baseline[2:]}/queued5"}
    # the ref DVC committed the experiment to
    assert subprocess.run(["git", "show-ref", "--verify", identity["dvc.exp_ref"]], cwd=repo).returncode == 0
    assert {key: parent.data.tags[key] for key in identity} == identity
    for run in stages:
        assert run.data.tags[pipeline_run.PARENT_TAG] == parent.info.run_id and run.data.params["seed"] == "5"
        assert f"dvc.out.{run.data.tags['vlmgym.stage']}.out" in run.data.tags
        assert {key: run.data.tags[key] for key in identity} == identity
        # what differs from the baseline is the experiment's -S change alone (not DVC's writes in the copy)
        assert (run.data.tags["git.dirty"], run.data.tags["git.changed"]) == ("true", "params.yaml")
    assert not list((repo / ".dvc" / "tmp").rglob("mlflow.db"))


UNREACHABLE_STAGE = """
from vlmgym.tracking.stage_runs import stage_run
with stage_run("download"):
    print("the stage's work ran")
"""


def test_an_unreachable_tracking_server_stops_a_stage_at_once_in_one_line(tmp_path):
    with socket.socket() as s:  # a free loopback port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", UNREACHABLE_STAGE], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "MLFLOW_TRACKING_URI": uri}, timeout=120)
    assert time.monotonic() - started < 30
    assert done.returncode == 1 and "the stage's work ran" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and uri in lines[0] and "unset MLFLOW_TRACKING_URI" in lines[0], done.stderr


def test_a_server_that_answers_passes_the_check():
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        tracking.check_reachable(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=5)
        server.shutdown()
    tracking.check_reachable("sqlite:///nowhere/mlflow.db", timeout_s=5)  # a local store needs no server


OUTAGE_STAGE = """
import os, signal, sys, time
from vlmgym.tracking.stage_runs import stage_run
with stage_run("train") as run:
    run.log_metrics({"loss": 1.0}, step=1)
    run.run_id  # waits for the run, which opens in the background
    time.sleep(2)  # the sender delivers step 1
    os.killpg(int(sys.argv[1]), signal.SIGKILL)  # the server goes away mid-stage
    started = time.monotonic()
    for step in range(2, 6):
        run.log_metrics({"loss": 1.0 / step}, step=step)
    run.log_dict({"done": True}, "summary.json")
    print(f"logging took {time.monotonic() - started:.3f} s")
"""


def test_a_server_gone_before_the_stage_ends_loses_nothing_and_tracking_sync_sends_the_rest(tmp_path):
    from mlflow_server import MlflowServer

    server = MlflowServer(tmp_path)
    server.start()
    (tmp_path / "params.yaml").write_text("tracking:\n  experiment: outage\n  flush_timeout_s: 3\n"
                                          "  system_metrics: false\n")
    env = {**os.environ, "MLFLOW_TRACKING_URI": server.uri, "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop(tracking.PIPELINE_ID_ENV, None)
    try:
        done = subprocess.run([sys.executable, "-c", OUTAGE_STAGE, str(server.process.pid)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert float(done.stdout.split("logging took ")[1].split()[0]) < 1  # the steps never waited for the server
        assert "vlmgym tracking sync" in done.stderr and "Traceback" not in done.stderr
        spooled = list((tmp_path / "mlflow-spool").iterdir())
        assert len(spooled) == 1
        server.kill()
        server.start()
        synced = subprocess.run([str(BIN / "vlmgym"), "tracking", "sync"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        assert synced.returncode == 0, synced.stderr + synced.stdout
        client = MlflowClient(server.uri)
        run = client.get_run(spooled[0].name)
        assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3, 4, 5]
        assert run.info.status == "FINISHED" and "summary.json" in {a.path for a in client.list_artifacts(
            run.info.run_id)}
        assert not (tmp_path / "mlflow-spool").exists() or not list((tmp_path / "mlflow-spool").iterdir())
    finally:
        server.kill()
