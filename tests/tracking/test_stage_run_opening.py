"""A stage run's handle before its MLflow run exists (it opens in a background thread): what is logged meanwhile
goes first into the run's journal, in order, less the steps a continued run already holds; a run that could not be
created stops the stage with its name."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from vlmgym.tracking import stage_runs
from vlmgym.tracking.spool import Spool


class _Sender:
    """A sender whose server takes everything at once."""

    def __init__(self):
        self.notified = 0

    def notify(self):
        self.notified += 1

    def flush(self, timeout_s):
        return True

    def stop(self):
        pass


def _slow_open(spool, seconds, then=lambda: None):
    """An open_run that takes `seconds`, calls `then`, and returns a new run (no parent) journalled in `spool`."""
    import time

    def open_run(request):
        time.sleep(seconds)
        then()
        run = SimpleNamespace(info=SimpleNamespace(run_id="run-1", experiment_id="0"))
        return stage_runs.Opened(run=run, client=None, spool=spool, sender=_Sender(), tags={}, parent_id=None,
                                 logged_through=-1, continued=False)

    return open_run


def _opened(tmp_path, logged_through=-1, parent="parent-run"):
    run = SimpleNamespace(info=SimpleNamespace(run_id="run-1"))
    return stage_runs.Opened(run=run, client=None, spool=Spool(tmp_path / "spool"), sender=_Sender(),
                             tags={"vlmgym.stage": "train"}, parent_id=parent, logged_through=logged_through,
                             continued=logged_through >= 0)


def _journal(opened):
    return [(e["kind"], e["run_id"], e.get("step"), e.get("values")) for _, e in opened.spool.pending()]


def test_what_is_logged_before_the_run_exists_goes_first_less_the_steps_it_holds(tmp_path):
    handle = stage_runs.StageRun("train")
    for step in (1, 2, 3):
        handle.log_metrics({"loss": 1.0 / step}, step=step)
    handle.log_params({"lr": "0.1"})
    handle.log_metrics({"final": 1.0})  # no step: never dropped
    opened = _opened(tmp_path, logged_through=2)  # a continued run that holds steps 1-2
    handle.attach(opened)
    handle.log_metrics({"loss": 0.2}, step=2)  # already held: dropped after the run exists too
    handle.log_metrics({"loss": 0.25}, step=4)
    assert _journal(opened) == [("metrics", "run-1", 3, {"loss": 1 / 3}), ("params", "run-1", None, {"lr": "0.1"}),
                                ("metrics", "run-1", 0, {"final": 1.0}), ("metrics", "run-1", 4, {"loss": 0.25})]
    assert handle.run_id == "run-1" and handle.parent_id == "parent-run" and handle.logged_through == 2
    assert opened.sender.notified >= 2


def test_the_attributes_that_name_the_run_wait_for_it(tmp_path):
    handle = stage_runs.StageRun("train")
    seen = []
    reader = threading.Thread(target=lambda: seen.append(handle.run_id))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and seen == []  # still waiting: the run does not exist yet
    handle.attach(_opened(tmp_path))
    reader.join(5)
    assert seen == ["run-1"]


def test_a_run_that_could_not_be_created_stops_the_stage_with_its_name(tmp_path, capsys):
    handle = stage_runs.StageRun("sft")
    handle.log_metrics({"loss": 1.0}, step=1)  # before the failure: kept in memory
    handle.fail_to_open(ConnectionError("the server went away\ndetails"))
    with pytest.raises(stage_runs.TrackingNotOpened, match=r"sft: its MLflow run could not be created "
                                                           r"\(ConnectionError: the server went away\)"):
        handle.log_metrics({"loss": 0.5}, step=2)
    with pytest.raises(stage_runs.TrackingNotOpened):
        handle.close("FINISHED", flush_timeout_s=1)  # the work succeeded: the stage still fails
    handle.close("FAILED", flush_timeout_s=1)  # the body's own error goes on: this one is only reported
    assert "sft: its MLflow run could not be created" in capsys.readouterr().err


def test_the_end_waits_for_what_the_opening_logs_after_the_run_exists(tmp_path, monkeypatch):
    """A stage whose work ends before its run is open: the end comes after the params the opening logs."""
    import time

    journal = []

    class Recorded(Spool):
        def append(self, entry):
            journal.append(entry["kind"])

    monkeypatch.setattr(stage_runs, "open_run", _slow_open(Recorded(tmp_path / "spool"), 0.3))
    log_params = stage_runs.StageRun.log_params

    def slow_params(self, params):  # the opening's own logging, after the run exists, takes its time too
        time.sleep(0.3)
        log_params(self, params)

    monkeypatch.setattr(stage_runs.StageRun, "log_params", slow_params)
    request = stage_runs.OpenRequest("train", tmp_path, "sqlite:///x.db", "unit", tmp_path / "params.yaml",
                                     {"deps": [], "outs": []}, {"lr": "0.1"}, None, None, False, False)
    handle = stage_runs.StageRun("train")
    handle.open_in_background(request)
    handle.log_metrics({"loss": 1.0}, step=1)
    handle.close("FINISHED", flush_timeout_s=1)
    assert journal == ["metrics", "params", "terminate"]


def test_a_write_inside_the_stage_commits_only_once_its_run_exists(tmp_path, monkeypatch):
    """So a stage killed inside a write always has a run to close as KILLED; the hook goes with the stage run."""

    from vlmgym.runtime import write_hooks
    from vlmgym.runtime.atomic import write_text_atomically

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    events = []

    monkeypatch.setattr(stage_runs, "open_run", _slow_open(Spool(tmp_path / "spool"), 0.5,
                                                           then=lambda: events.append("run exists")))
    hooks_before = list(write_hooks.before_rename)
    with stage_runs.stage_run("download"):
        write_text_atomically(tmp_path / "out.txt", "the stage's output")
        events.append("written")
    assert events == ["run exists", "written"]
    assert (tmp_path / "out.txt").read_text() == "the stage's output"
    assert write_hooks.before_rename == hooks_before
