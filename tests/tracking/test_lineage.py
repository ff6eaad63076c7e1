"""Lineage the MLflow runs of a pipeline tell (vlmgym.tracking.stage_runs, vlmgym.tracking.pipeline_run): the git
state leaves out what DVC itself rewrites while the pipeline runs, a DVC experiment's stages name the experiment, and
the pipeline's parent run carries the training curves and names the run of every stage, those DVC did not rerun
included. DVC's own writes and environment are made by hand here, in a temp git repository with a SQLite store."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import mlflow
import pytest
import yaml
from mlflow.tracking import MlflowClient

from vlmgym.tracking import pipeline_run
from vlmgym.tracking import stage_runs as tracking
from vlmgym.tracking.step_curve import write_curve

DVC_YAML = textwrap.dedent(
    """
    stages:
      sft:
        cmd: python stages/sft.py
        deps: [src/code.py, data/shards]
        outs: [models/sft, metrics/curves/sft.jsonl]
        metrics:
          - metrics/sft.json:
              cache: false
      train:
        cmd: python stages/train.py
        deps: [src/code.py, models/sft]
        outs: [models/grpo, metrics/curves/train.jsonl]
      evaluate:
        cmd: python stages/evaluate.py
        deps: [models/grpo]
        outs:
          - metrics/plots:
              cache: false
    plots:
      - reward:
          y:
            metrics/plots/reward.csv: reward
    """
)
SFT_CURVE = {1: {"loss": 2.0}, 2: {"loss": 1.5, "val/reward_greedy": 0.25}, 3: {"loss": 1.0}}
TRAIN_CURVE = {1: {"reward_mean": 0.25, "kl": 0.0}, 2: {"reward_mean": 0.5, "kl": 0.01}}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def lock(repo: Path, stages: dict[str, list[str]]) -> None:
    """dvc.lock as DVC writes it after running `stages` (each with its outs' hashes as they are now)."""
    entries = {name: {"cmd": f"python stages/{name}.py",
                      "outs": [{"path": out, "hash": "md5", "md5": tracking.dvc_hash(repo / out)} for out in outs]}
               for name, outs in stages.items()}
    (repo / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": entries}, sort_keys=False))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A committed pipeline repository: code, dvc.yaml, dvc.lock and the git-tracked outputs (metrics, plots, the
    .gitignore DVC wrote for the curves) as a finished `dvc repro` and `git commit` leave them."""
    repo = tmp_path / "repo"
    for path, text in {"src/code.py": "x = 1\n", "dvc.yaml": DVC_YAML, "params.yaml": "sft:\n  steps: 3\n",
                       "metrics/sft.json": '{"final_loss": 1.0}\n', "metrics/plots/reward.csv": "step,reward\n",
                       "metrics/curves/.gitignore": "/sft.jsonl\n", ".gitignore": "/models\n/data\n",
                       "dvc.lock": "schema: '2.0'\nstages: {}\n"}.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "pipeline")
    return repo


def test_a_clean_checkout_stays_clean_while_dvc_rewrites_the_pipelines_own_files(repo):
    # What a repro does to the tree before a later stage starts: it deletes a stage's outputs before running it
    # (metrics/sft.json is git-tracked), rewrites and stages dvc.lock, rewrites tracked plots and adds a
    # .gitignore line for a new output.
    (repo / "metrics/sft.json").unlink()
    (repo / "metrics/plots/reward.csv").write_text("step,reward\n1,0.5\n")
    (repo / "dvc.lock").write_text("schema: '2.0'\nstages:\n  sft: {}\n")
    (repo / "metrics/curves/.gitignore").write_text("/sft.jsonl\n/train.jsonl\n")
    git(repo, "add", "dvc.lock", "metrics/curves/.gitignore")
    state = tracking.git_state(repo)
    assert git(repo, "status", "--porcelain", "--untracked-files=no").strip()  # git itself sees changes
    assert state == {"git.commit": git(repo, "rev-parse", "HEAD").strip(), "git.dirty": "false", "git.changed": ""}


def test_a_changed_source_file_or_a_gitignore_line_of_its_own_is_dirty_and_named(repo):
    (repo / "metrics/sft.json").unlink()  # the pipeline's: never named
    (repo / "src/code.py").write_text("x = 2\n")
    (repo / "metrics/curves/.gitignore").write_text("/sft.jsonl\n/notes.txt\n")  # not a line DVC writes
    state = tracking.git_state(repo)
    assert state["git.dirty"] == "true"
    assert state["git.changed"] == "metrics/curves/.gitignore, src/code.py"


def test_a_study_dvc_yaml_with_a_matrix_owns_its_outputs_too(repo):
    study = repo / "studies" / "s"
    study.mkdir(parents=True)
    (study / "dvc.yaml").write_text(textwrap.dedent(
        """
        stages:
          arm:
            matrix:
              seed: [1, 2]
            wdir: ../..
            cmd: vlmgym study arm --seed ${item.seed}
            outs:
              - studies/s/runs/${item.seed}/answers.jsonl:
                  cache: false
        """
    ))
    (study / "runs" / "1").mkdir(parents=True)
    (study / "runs" / "1" / "answers.jsonl").write_text("{}\n")
    git(repo, "add", "studies")
    git(repo, "commit", "-qm", "study")
    (study / "runs" / "1" / "answers.jsonl").write_text('{"reward": 1}\n')
    assert tracking.git_state(repo)["git.dirty"] == "false"


@pytest.fixture(scope="module")
def database(tmp_path_factory) -> str:
    """One SQLite store for the module (making one takes seconds); each test logs to an experiment of its own."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


@pytest.fixture
def store(database, monkeypatch, repo, request):
    """The store, for stages run in `repo` as DVC runs them (DVC_ROOT), into the test's own experiment."""
    uri = database
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # stage_run points MLflow's process-wide URI at the store: put it back after the test.
    monkeypatch.setattr(mlflow.tracking._tracking_service.utils, "_tracking_uri", uri)
    monkeypatch.setenv("DVC_ROOT", str(repo))
    monkeypatch.chdir(repo)
    for name in ("DVC_STAGE", "DVC_EXP_NAME", "DVC_EXP_BASELINE_REV"):
        monkeypatch.delenv(name, raising=False)
    (repo / "params.yaml").write_text(f"tracking:\n  experiment: {request.node.name}\n  system_metrics: false\n")
    return MlflowClient(uri)


def run_stage(monkeypatch, pipeline: str, stage: str, body=None) -> str:
    """One stage run of pipeline `pipeline`, as DVC starts it; its run id."""
    monkeypatch.setenv(tracking.PIPELINE_ID_ENV, pipeline)
    monkeypatch.setenv("DVC_STAGE", stage)
    with tracking.stage_run(stage, {"steps": 3}) as run:
        if body:
            body()
    return run.run_id


def write_sft():
    Path("models/sft").mkdir(parents=True, exist_ok=True)
    Path("models/sft/weights.bin").write_text("sft weights")
    Path("metrics/sft.json").write_text('{"final_loss": 1.0}\n')
    write_curve(pipeline_run.curve_file("sft"), SFT_CURVE)


def write_train():
    Path("models/grpo").mkdir(parents=True, exist_ok=True)
    Path("models/grpo/weights.bin").write_text("grpo weights")
    write_curve(pipeline_run.curve_file("train"), TRAIN_CURVE)


def parent_of(client: MlflowClient, run_id: str):
    return client.get_run(client.get_run(run_id).data.tags[pipeline_run.PARENT_TAG])


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_an_experiments_stage_and_parent_name_the_experiment_its_baseline_and_its_ref(repo, store, monkeypatch):
    baseline = git(repo, "rev-parse", "HEAD").strip()
    monkeypatch.setenv("DVC_EXP_NAME", "brisk-lamb")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", baseline)
    # `dvc exp run -S` applies the experiment's params to the baseline's tree
    git(repo, "checkout", "-q", "--detach")
    params = repo / "params.yaml"
    params.write_text(params.read_text() + "sft:\n  steps: 5\n")
    run_id = run_stage(monkeypatch, "exp-pipe", "sft", write_sft)
    tags = store.get_run(run_id).data.tags
    identity = {"dvc.exp_name": "brisk-lamb", "dvc.exp_baseline_rev": baseline,
                "dvc.exp_ref": f"refs/exps/{baseline[:2]}/{baseline[2:]}/brisk-lamb"}
    assert {key: tags[key] for key in identity} == identity
    # the commit is the baseline, and the experiment's own change is what differs from it
    assert (tags["git.commit"], tags["git.dirty"], tags["git.changed"]) == (baseline, "true", "params.yaml")
    parent = parent_of(store, run_id).data.tags
    assert {key: parent[key] for key in identity} == identity and parent["git.commit"] == baseline


def test_the_parent_run_carries_each_training_stages_curve_under_its_name(repo, store, monkeypatch):
    sft = run_stage(monkeypatch, "pipe-1", "sft", write_sft)
    train = run_stage(monkeypatch, "pipe-1", "train", write_train)
    parent = parent_of(store, train)
    assert parent.info.run_id == parent_of(store, sft).info.run_id
    assert history(store, parent.info.run_id, "sft/loss") == [(1, 2.0), (2, 1.5), (3, 1.0)]
    assert history(store, parent.info.run_id, "sft/val/reward_greedy") == [(2, 0.25)]
    assert history(store, parent.info.run_id, "train/reward_mean") == [(1, 0.25), (2, 0.5)]
    assert history(store, parent.info.run_id, "train/kl") == [(1, 0.0), (2, 0.01)]
    assert parent.data.tags[pipeline_run.STAGE_CURVE_TAG + "train"] == tracking.dvc_hash(
        repo / pipeline_run.curve_file("train"))
    # the stages' own runs keep theirs unprefixed (the stage scripts log them step by step)
    assert "sft/loss" not in store.get_run(sft).data.metrics


def test_a_cached_stage_is_named_on_the_parent_by_the_run_that_wrote_its_outputs(repo, store, monkeypatch):
    sft = run_stage(monkeypatch, "pipe-1", "sft", write_sft)
    lock(repo, {"sft": ["models/sft", "metrics/curves/sft.jsonl", "metrics/sft.json"]})
    # A later `dvc repro` (another train param): DVC keeps sft's outputs and reruns train alone.
    train = run_stage(monkeypatch, "pipe-2", "train", write_train)
    parent = parent_of(store, train)
    assert parent.info.run_id != parent_of(store, sft).info.run_id
    tags = parent.data.tags
    assert (tags[pipeline_run.STAGE_RUN_TAG + "sft"], tags[pipeline_run.STAGE_CACHED_TAG + "sft"]) == (sft, "true")
    assert (tags[pipeline_run.STAGE_RUN_TAG + "train"], tags[pipeline_run.STAGE_CACHED_TAG + "train"]) == (
        train, "false")
    # the cached stage's curve is on this parent too, from the output dvc.lock records, so two experiments'
    # parents compare whole
    assert history(store, parent.info.run_id, "sft/loss") == [(1, 2.0), (2, 1.5), (3, 1.0)]
    assert tags[pipeline_run.STAGE_CURVE_TAG + "sft"] == tracking.dvc_hash(repo / pipeline_run.curve_file("sft"))
    # evaluate has never run: dvc.lock has no entry, so the parent names no run for it
    assert pipeline_run.STAGE_RUN_TAG + "evaluate" not in tags


def test_a_cached_stage_whose_run_is_not_in_the_store_is_named_unknown(repo, store, monkeypatch):
    write_sft()  # outputs from before this store existed (e.g. `dvc pull`ed)
    lock(repo, {"sft": ["models/sft", "metrics/curves/sft.jsonl", "metrics/sft.json"]})
    train = run_stage(monkeypatch, "pipe-1", "train", write_train)
    tags = parent_of(store, train).data.tags
    assert (tags[pipeline_run.STAGE_RUN_TAG + "sft"], tags[pipeline_run.STAGE_CACHED_TAG + "sft"]) == (
        pipeline_run.UNKNOWN, "true")


def test_a_cached_curve_that_differs_from_dvc_lock_is_not_copied(repo, store, monkeypatch):
    run_stage(monkeypatch, "pipe-1", "sft", write_sft)
    lock(repo, {"sft": ["models/sft", "metrics/curves/sft.jsonl", "metrics/sft.json"]})
    write_curve(pipeline_run.curve_file("sft"), {1: {"loss": 9.0}})  # not the file dvc.lock records
    train = run_stage(monkeypatch, "pipe-2", "train", write_train)
    parent = parent_of(store, train)
    assert "sft/loss" not in parent.data.metrics
    assert pipeline_run.STAGE_CURVE_TAG + "sft" not in parent.data.tags


def test_a_later_stage_that_reruns_takes_its_place_and_its_old_curve_is_never_copied(repo, store, monkeypatch):
    old_sft = run_stage(monkeypatch, "pipe-1", "sft", write_sft)
    old_train = run_stage(monkeypatch, "pipe-1", "train", write_train)
    lock(repo, {"sft": ["models/sft", "metrics/curves/sft.jsonl", "metrics/sft.json"],
                "train": ["models/grpo", "metrics/curves/train.jsonl"]})
    # Another repro reruns sft (an sft param), then train: as sft starts, dvc.lock still records the old train.
    new_sft = run_stage(monkeypatch, "pipe-2", "sft", write_sft)
    parent = parent_of(store, new_sft)
    assert parent.data.tags[pipeline_run.STAGE_RUN_TAG + "train"] == old_train
    assert "train/reward_mean" not in parent.data.metrics  # not upstream of sft: it may still rerun
    new_train = run_stage(monkeypatch, "pipe-2", "train", lambda: write_curve(
        pipeline_run.curve_file("train"), {1: {"reward_mean": 0.75}}))
    tags = store.get_run(parent.info.run_id).data.tags
    assert {stage: tags[pipeline_run.STAGE_RUN_TAG + stage] for stage in ("sft", "train")} == {
        "sft": new_sft, "train": new_train}
    assert new_sft != old_sft
    assert history(store, parent.info.run_id, "train/reward_mean") == [(1, 0.75)]
    assert history(store, parent.info.run_id, "sft/loss") == [(1, 2.0), (2, 1.5), (3, 1.0)]  # copied once


def test_a_stage_of_another_dvc_yaml_adds_no_references_to_the_pipeline(repo, store, monkeypatch):
    monkeypatch.setenv(tracking.PIPELINE_ID_ENV, "study-pipe")
    monkeypatch.setenv("DVC_STAGE", "studies/s/dvc.yaml:sft")  # a study runs the same scripts
    with tracking.stage_run("sft", {"steps": 3}) as run:
        write_sft()
    parent = parent_of(store, run.run_id)
    assert not [key for key in parent.data.tags if key.startswith(pipeline_run.STAGE_RUN_TAG)]
    assert "sft/loss" not in parent.data.metrics


def test_upstream_follows_outputs_through_stages(repo):
    stages = pipeline_run.dvc_stages(repo)
    assert stages["evaluate"]["outs"] == ["metrics/plots"]
    assert pipeline_run.upstream("evaluate", stages) == {"sft", "train"}
    assert pipeline_run.upstream("train", stages) == {"sft"}
    assert pipeline_run.upstream("sft", stages) == set()


def test_a_curve_that_cannot_be_read_leaves_the_stage_finished_without_a_copy(repo, store, monkeypatch, capsys):
    def body():
        write_sft()
        Path(pipeline_run.curve_file("sft")).write_text("not json\n")

    sft = run_stage(monkeypatch, "pipe-1", "sft", body)
    assert store.get_run(sft).info.status == "FINISHED"
    parent = parent_of(store, sft)
    assert not [key for key in parent.data.metrics if key.startswith("sft/")]
    assert "sft's curve is not copied" in capsys.readouterr().err
