"""A training run over two processes (jax.distributed on gloo, one CPU device each) equals the same run in one
process over a 2-device mesh, with every objective knob of the loss on; a process that dies stops the other with a
clear error; a restart resumes."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from vlmgym.plan.cli import with_device_count
from vlmgym.runtime import distributed

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("multihost_worker.py")
STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (distributed.COORDINATOR_ENV,
                                                          distributed.NUM_PROCESSES_ENV, distributed.PROCESS_ID_ENV)}
    return {**env, "JAX_PLATFORMS": "cpu", distributed.HEARTBEAT_ENV: "5", **extra}


def _start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, str(WORKER), *map(str, args)], cwd=WORKER.parent, env=env,
                                stdout=handle, stderr=subprocess.STDOUT)


def _two_processes(args: list[str], tmp_path: Path, name: str) -> list[subprocess.Popen]:
    port = _free_port()
    return [_start(args, _env(**{distributed.COORDINATOR_ENV: f"127.0.0.1:{port}",
                                 distributed.NUM_PROCESSES_ENV: "2", distributed.PROCESS_ID_ENV: str(i)}),
                   tmp_path / f"{name}-{i}.log") for i in range(2)]


def _wait(process: subprocess.Popen, log: Path, timeout: float = 600) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"{log} did not finish in {timeout} s:\n{log.read_text()[-3000:]}")


def _params(prefix: Path) -> dict:
    with np.load(f"{prefix}.npz") as data:
        return {name: data[name] for name in data.files}


def test_two_processes_train_as_one_and_resume_after_a_kill(tiny_vlm, tmp_path):
    model, checkpoints = tiny_vlm.folder, tmp_path / "checkpoints"
    # The reference: one process over the same 2-device mesh and batch, uninterrupted (beside the rest: the
    # test's time is mostly compiling, which each run does once).
    # Every loss knob is on (the worker's KNOBS): GSPO's sequence ratio, the sampler correction and the entropy
    # quantile reduce over the whole batch, whichever process holds its rows. The default loss is sharded_step.py's.
    two_devices = with_device_count(os.environ.get("XLA_FLAGS", ""), 2)
    single = _start([model, tmp_path / "single-checkpoints", tmp_path / "single", STEPS, "--knobs"],
                    _env(XLA_FLAGS=two_devices), tmp_path / "single.log")
    # 1. Two processes; process 1 hangs after step 2 (before that step's checkpoint), and is killed there.
    first = _two_processes([model, checkpoints, tmp_path / "killed", STEPS, "--hang-at", 2, "--knobs"], tmp_path,
                           "first")
    hung = tmp_path / "killed.hung"
    deadline = time.time() + 600
    while not hung.exists():
        if time.time() > deadline or any(p.poll() is not None for p in first):
            for p in first:
                p.kill()
            pytest.fail("process 1 never reached its hang:\n" + (tmp_path / "first-0.log").read_text()[-3000:])
        time.sleep(0.2)
    first[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    code = _wait(first[0], tmp_path / "first-0.log", timeout=120)
    log = (tmp_path / "first-0.log").read_text()
    assert code != 0
    assert time.time() - killed_at < 60  # the heartbeat timeout is 5 s
    assert "all of them stop" in log or "another task died" in log, log[-3000:]
    assert not (tmp_path / "killed.npz").exists()

    # 2. Both again: the run resumes from the last complete checkpoint (step 1) and finishes.
    second = _two_processes([model, checkpoints, tmp_path / "resumed", STEPS, "--knobs"], tmp_path, "second")
    for i, process in enumerate(second):
        assert _wait(process, tmp_path / f"second-{i}.log") == 0, (tmp_path / f"second-{i}.log").read_text()[-3000:]
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["processes"] == 2 and resumed["resumed_from"] == 1

    assert _wait(single, tmp_path / "single.log") == 0, (tmp_path / "single.log").read_text()[-3000:]
    reference = json.loads((tmp_path / "single.json").read_text())
    assert reference["processes"] == 1 and reference["resumed_from"] is None

    # The figures of the steps after the resume, and the final params, are the single-process run's.
    for ours, theirs in zip(resumed["history"], reference["history"][1:]):
        for name, value in theirs.items():
            assert ours[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    ours, theirs = _params(tmp_path / "resumed"), _params(tmp_path / "single")
    assert ours.keys() == theirs.keys() and len(ours) > 10
    moved = 0.0
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=0, atol=1e-6, err_msg=name)
        moved = max(moved, float(np.abs(theirs[name] - _initial(tiny_vlm, name)).max()))
    assert moved > 1e-3  # the steps trained: a layout that trained differently would be far outside 1e-6


def test_two_processes_filter_groups_each_refilling_its_own_prompts(tiny_vlm, tmp_path):
    # Each process keeps sampling until its own prompts' groups vary on `long`; all of them run as many rounds as
    # the one that needs the most, so the collective sampling copy and the data order stay in step.
    processes = _two_processes([tiny_vlm.folder, tmp_path / "checkpoints", tmp_path / "filtered", STEPS, "--filter"],
                               tmp_path, "filtered")
    for i, process in enumerate(processes):
        assert _wait(process, tmp_path / f"filtered-{i}.log") == 0, (tmp_path / f"filtered-{i}.log").read_text()[-3000:]
    run = json.loads((tmp_path / "filtered.json").read_text())
    assert run["processes"] == 2 and len(run["history"]) == STEPS
    history = run["history"]
    assert sum(m["groups_dropped"] for m in history) > 0 and max(m["sample_rounds"] for m in history) > 1
    assert all(np.isfinite(m["loss"]) for m in history)
    orders = [json.loads((tmp_path / f"filtered.{i}.data.json").read_text()) for i in range(2)]
    assert orders[0] == orders[1]


def _initial(tiny_vlm, name: str) -> np.ndarray:
    import jax

    leaves = {jax.tree_util.keystr(path): np.asarray(leaf)
              for path, leaf in jax.tree_util.tree_leaves_with_path(tiny_vlm.params)}
    return leaves[name]


def test_settings_come_from_the_environment_or_flags():
    env = {distributed.COORDINATOR_ENV: "10.0.0.1:1234", distributed.NUM_PROCESSES_ENV: "4",
           distributed.PROCESS_ID_ENV: "3"}
    assert distributed.settings_from(environ=env) == distributed.Settings("10.0.0.1:1234", 4, 3)
    assert distributed.settings_from(process_id=1, environ=env).process_id == 1
    assert distributed.settings_from(environ={}) is None
    assert distributed.settings_from(environ={distributed.NUM_PROCESSES_ENV: "1"}) is None
    with pytest.raises(ValueError, match="missing: JAX_PROCESS_ID"):
        distributed.settings_from(environ={distributed.COORDINATOR_ENV: "h:1", distributed.NUM_PROCESSES_ENV: "2"})
    with pytest.raises(ValueError, match="expected an integer"):
        distributed.settings_from(environ={**env, distributed.PROCESS_ID_ENV: "one"})
    with pytest.raises(ValueError, match="0 <= id < count"):
        distributed.settings_from(environ={**env, distributed.PROCESS_ID_ENV: "4"})
    with pytest.raises(ValueError, match="host:port"):
        distributed.settings_from(environ={**env, distributed.COORDINATOR_ENV: "10.0.0.1"})


def test_what_a_run_over_several_processes_refuses(monkeypatch):
    from types import SimpleNamespace

    from vlmgym.params import TrainParams
    from vlmgym.rl.multiprocess import check_multiprocess

    monkeypatch.setattr(distributed, "count", lambda: 2)
    meshed = SimpleNamespace(mesh=object())
    check_multiprocess(TrainParams(batch_prompts=4), meshed)
    check_multiprocess(TrainParams(batch_prompts=4, algorithm="rloo"), meshed)
    check_multiprocess(TrainParams(batch_prompts=4, filter_groups=True), meshed)
    for config, message in ((TrainParams(batch_prompts=4, algorithm="ppo"), "runs in one process"),
                            (TrainParams(batch_prompts=4, algorithm="online_dpo"), "runs in one process"),
                            (TrainParams(batch_prompts=3), "split evenly over 2 processes")):
        with pytest.raises(ValueError, match=message):
            check_multiprocess(config, meshed)
    with pytest.raises(ValueError, match="device mesh"):
        check_multiprocess(TrainParams(batch_prompts=4), SimpleNamespace(mesh=None))
