"""The MLflow spool: every entry reaches the server once, in order, through failures, restarts and lost answers."""

import json
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from vlmgym.tracking import spool as spool_mod


class Server:
    """A stand-in MLflow client: stores log_batch metrics, fails while `down`, and can store a batch and then
    lose its answer (`lose_answer`)."""

    def __init__(self):
        self.down = False
        self.lose_answer = 0
        self.metrics: list[tuple[str, str, int, int, float]] = []  # run, key, step, timestamp, value
        self.terminated: dict[str, str] = {}
        self.calls = 0
        self.lock = threading.Lock()

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        with self.lock:
            self.calls += 1
            if self.down:
                raise ConnectionError("server down")
            self.metrics += [(run_id, m.key, m.step, m.timestamp, m.value) for m in metrics]
            if self.lose_answer:
                self.lose_answer -= 1
                raise TimeoutError("answer lost")

    def get_metric_history(self, run_id, key):
        if self.down:
            raise ConnectionError("server down")

        class M:
            def __init__(self, step, timestamp):
                self.step, self.timestamp = step, timestamp

        return [M(step, ts) for run, k, step, ts, _ in self.metrics if run == run_id and k == key]

    def set_terminated(self, run_id, status, end_time=None):
        if self.down:
            raise ConnectionError("server down")
        self.terminated[run_id] = status


def metrics_entry(step, run_id="r"):
    return {"kind": "metrics", "run_id": run_id, "step": step, "timestamp": 1000 + step, "values": {"loss": step / 10}}


def steps_on(server, run_id="r"):
    return sorted(step for run, key, step, _, _ in server.metrics if run == run_id and key == "loss")


def test_entries_sent_in_order_and_once_and_the_folder_records_progress(tmp_path):
    spool = spool_mod.Spool(tmp_path / "s")
    for step in range(5):
        spool.append(metrics_entry(step))
    spool.append({"kind": "terminate", "run_id": "r", "status": "FINISHED", "timestamp": 9})
    server = Server()
    assert spool_mod.send_pending(spool, server, check_first=True) == 6
    assert steps_on(server) == [0, 1, 2, 3, 4] and server.terminated == {"r": "FINISHED"}
    assert spool.is_sent() and spool_mod.send_pending(spool, server, check_first=True) == 0
    assert server.calls == 1  # the five steps went as one batch


def test_a_batch_the_server_stored_before_its_answer_was_lost_is_not_sent_again(tmp_path):
    spool = spool_mod.Spool(tmp_path / "s")
    for step in range(3):
        spool.append(metrics_entry(step))
    server = Server()
    server.lose_answer = 1
    with pytest.raises(TimeoutError):
        spool_mod.send_pending(spool, server, check_first=False)
    spool.append(metrics_entry(3))
    spool_mod.send_pending(spool, server, check_first=True)
    assert steps_on(server) == [0, 1, 2, 3]


def test_a_partial_last_line_left_by_a_killed_writer_is_cut_when_claimed(tmp_path):
    spool = spool_mod.Spool(tmp_path / "s")
    spool.append(metrics_entry(0))
    with open(spool.journal, "a") as f:
        f.write('{"kind": "metr')
    assert [e["step"] for _, e in spool.pending()] == [0]
    spool.claim()
    spool.append(metrics_entry(1))
    assert [e["step"] for _, e in spool.pending()] == [0, 1]
    assert spool.max_step("r") == 1 and spool.max_step("other") == -1


def test_the_sender_goes_on_through_an_outage_and_sends_everything_once_when_the_server_is_back(tmp_path, monkeypatch):
    monkeypatch.setattr(spool_mod, "RETRY_DELAYS_S", (0.05,))
    said = []
    spool = spool_mod.Spool(tmp_path / "s")
    spool.set_uri("http://example.invalid")
    server = Server()
    sender = spool_mod.Sender(spool, server, say=said.append)
    spool.append(metrics_entry(0))
    sender.notify()
    assert sender.flush(5)
    server.down = True
    started = time.monotonic()
    for step in range(1, 20):
        spool.append(metrics_entry(step))
        sender.notify()
    assert time.monotonic() - started < 1  # appending never waits for the server
    assert not sender.flush(0.3)
    assert len(said) == 1 and "the logs wait in" in said[0]
    server.down = False
    assert sender.flush(5)
    sender.stop()
    assert steps_on(server) == list(range(20))
    assert len(said) == 2 and "nothing was lost" in said[1]


def test_sync_sends_what_was_left_to_a_real_store_and_leaves_a_spool_in_use(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("unit")).info.run_id
    left = spool_mod.run_spool(tmp_path, run_id, uri)
    for step in range(3):
        left.append(metrics_entry(step, run_id))
    left.append({"kind": "params", "run_id": run_id, "values": {"lr": "0.1"}})
    left.append({"kind": "tags", "run_id": run_id, "values": {"t": "x"}})
    (tmp_path / "a.txt").write_text("artifact\n")
    left.append({"kind": "artifact", "run_id": run_id, "file": left.keep_file(tmp_path / "a.txt"),
                 "artifact_path": "notes"})
    left.append({"kind": "table", "run_id": run_id, "data": {"step": [1], "answer": ["x"]},
                 "artifact_file": "samples/table.json"})
    left.append({"kind": "terminate", "run_id": run_id, "status": "FINISHED", "timestamp": 5000})
    busy_id = client.create_run(client.create_experiment("busy")).info.run_id
    busy = spool_mod.run_spool(tmp_path, busy_id, uri)  # claimed: a live stage's
    busy.append(metrics_entry(0, busy_id))
    left.release()  # its process ended
    said = []
    assert spool_mod.sync(tmp_path, say=said.append) == (1, 1)
    run = client.get_run(run_id)
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [0, 1, 2]
    assert run.data.params == {"lr": "0.1"} and run.data.tags["t"] == "x" and run.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(run_id)} == {"notes", "samples"}
    assert not left.folder.exists() and busy.folder.exists()
    assert spool_mod.sync(tmp_path, say=said.append) == (0, 1)  # sent once: a second sync finds nothing new
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [0, 1, 2]
    busy.release()
    assert spool_mod.sync(tmp_path, say=said.append) == (1, 0)
    assert [m.step for m in client.get_metric_history(busy_id, "loss")] == [0]


def test_the_journal_holds_plain_json(tmp_path):
    spool = spool_mod.Spool(tmp_path / "s")
    spool.append(metrics_entry(0))
    assert json.loads(Path(spool.journal).read_text())["values"] == {"loss": 0.0}
    with pytest.raises(ValueError):
        spool.append({"kind": "metrics", "run_id": "r", "step": 1, "timestamp": 1, "values": {"x": float("nan")}})


def test_an_entry_the_server_refuses_is_passed_over_with_a_warning_and_does_not_hold_up_the_rest(tmp_path):
    from mlflow.exceptions import MlflowException

    class Refusing(Server):
        def set_terminated(self, run_id, status, end_time=None):
            raise MlflowException.invalid_parameter_value(f"no such run {run_id}")

    spool = spool_mod.Spool(tmp_path / "s")
    spool.append(metrics_entry(0))
    spool.append({"kind": "terminate", "run_id": "gone", "status": "FINISHED", "timestamp": 9})
    spool.append(metrics_entry(1))
    server, said = Refusing(), []
    assert spool_mod.send_pending(spool, server, check_first=False, say=said.append) == 3
    assert steps_on(server) == [0, 1] and spool.is_sent()
    assert len(said) == 1 and "refused 1 terminate entry of run gone" in said[0]
    server.down = True  # a server that cannot be reached is not a refusal: the caller retries
    spool.append(metrics_entry(2))
    with pytest.raises(ConnectionError):
        spool_mod.send_pending(spool, server, check_first=False, say=said.append)
    assert not spool.is_sent()


def test_the_lookup_at_a_resume_point_passes_over_entries_that_are_not_metrics(tmp_path):
    spool = spool_mod.Spool(tmp_path / "s")
    spool.append({"kind": "terminate", "run_id": "r", "status": "FINISHED", "timestamp": 9})
    spool.append(metrics_entry(0))
    server = Server()
    assert spool_mod.send_pending(spool, server, check_first=True) == 2
    assert server.terminated == {"r": "FINISHED"} and steps_on(server) == [0]
