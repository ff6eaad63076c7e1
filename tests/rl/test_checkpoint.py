"""Checkpoint manager: keep-K, exact round trip of every piece of state, atomic steps."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vlmgym.rl.checkpoint import ORBAX_TEMP_GLOB, CheckpointDamaged, CheckpointManager
from vlmgym.rl.optim import Optimizer, OptimizerConfig, trainable_mask
from vlmgym.runtime import killpoint


@pytest.fixture(scope="module")
def state():
    params = {"visual": {"w": jnp.array([[-0.0, 1.5]], jnp.bfloat16)}, "text": {"w": jnp.full((2, 3), 0.25),
                                                                              "b": jnp.arange(3.0)}}
    optimizer = Optimizer(OptimizerConfig(), trainable_mask(params, "vision"))
    opt_state = optimizer.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    params, opt_state, _ = optimizer.update(grads, opt_state, params)
    return params, opt_state


def test_round_trip_keeps_the_newest_and_restores_everything_exactly(tmp_path, state):
    params, opt_state = state
    key = jax.random.fold_in(jax.random.key(7), 3)
    with CheckpointManager(tmp_path, save_every=2, keep=2) as manager:
        saved = [manager.save(step, params, opt_state, key, {"data": {"epoch": 1, "position": step}, "x": 0.1})
                 for step in range(1, 8)]
        assert saved == [False, True, False, True, False, True, False]
        assert manager.save(7, params, opt_state, key, {"data": {"epoch": 1, "position": 7}}, force=True)
    with CheckpointManager(tmp_path, save_every=2, keep=2) as manager:
        assert manager.all_steps() == [6, 7]
        restored = manager.restore(params, opt_state)
        assert restored.step == 7 and restored.loop_state == {"data": {"epoch": 1, "position": 7}}
        earlier = manager.restore(params, opt_state, step=6)
        assert earlier.loop_state == {"data": {"epoch": 1, "position": 6}, "x": 0.1}
    assert jax.tree.structure(restored.opt_state) == jax.tree.structure(opt_state)
    for a, b in zip(jax.tree.leaves((restored.params, restored.opt_state)), jax.tree.leaves((params, opt_state))):
        assert a.dtype == b.dtype
        bits = [np.atleast_1d(np.asarray(x)).view(np.uint8) for x in (a, b)]
        np.testing.assert_array_equal(*bits)
    np.testing.assert_array_equal(jax.random.key_data(restored.rng), jax.random.key_data(key))
    np.testing.assert_array_equal(jax.random.uniform(restored.rng, (3,)), jax.random.uniform(key, (3,)))


def test_an_interrupted_save_is_never_restored_and_is_cleaned_up(tmp_path, state):
    params, opt_state = state
    key = jax.random.key(0)
    with CheckpointManager(tmp_path, save_every=1, keep=3) as manager:
        manager.save(1, params, opt_state, key)
    # A run killed mid-save leaves orbax's temporary step directory, never a finalised one.
    partial = tmp_path / "2.orbax-checkpoint-tmp-1234"
    (partial / "params").mkdir(parents=True)
    (partial / "params" / "half-written").write_bytes(b"\0" * 10)
    with CheckpointManager(tmp_path, save_every=1, keep=3) as manager:
        assert manager.latest_step() == 1
        assert manager.restore(params, opt_state).step == 1
    assert not partial.exists()


KILLED_SAVE = """
import sys
import jax, jax.numpy as jnp
from vlmgym.runtime import killpoint
from vlmgym.rl.checkpoint import ORBAX_TEMP_GLOB, CheckpointDamaged, CheckpointManager
params = {"w": jnp.arange(200_000.0)}
with CheckpointManager(sys.argv[1], save_every=1, keep=3) as manager:
    for step in (1, 2):
        manager.save(step, params, {"m": params}, jax.random.key(0))
print("saved")
"""


def test_a_process_killed_inside_a_save_leaves_no_orbax_temp_and_resumes_from_the_last_step(tmp_path):
    # A real SIGKILL while orbax writes step 2 (VLMGYM_KILL_IN_WRITE armed for that step's folder): the
    # writer's janitor removes orbax's temp step folder as soon as the process is gone.
    env = {**os.environ, killpoint.ENV: f"*/{tmp_path.name}/2"}
    killed = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(tmp_path)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL and "saved" not in killed.stdout, killed.stderr[-2000:]
    assert f"removed {tmp_path / '2.orbax-checkpoint-tmp'}" in killed.stderr, killed.stderr[-2000:]
    assert not list(tmp_path.glob(ORBAX_TEMP_GLOB))
    with CheckpointManager(tmp_path, save_every=1, keep=3) as manager:
        assert manager.all_steps() == [1]


def test_opening_a_folder_removes_unfinished_saves_and_says_so(tmp_path, state, capsys):
    # What is left when the janitor is lost too (the machine went down inside a save).
    params, opt_state = state
    with CheckpointManager(tmp_path, save_every=1, keep=3) as manager:
        manager.save(1, params, opt_state, jax.random.key(0))
    partial = tmp_path / "2.orbax-checkpoint-tmp"
    (partial / "params").mkdir(parents=True)
    (partial / "params" / "half-written").write_bytes(b"\0" * 2000)
    with CheckpointManager(tmp_path, save_every=1, keep=3) as manager:
        assert manager.latest_step() == 1
    assert not partial.exists()
    assert f"removed {partial} (2.0 KB), a checkpoint save that never finished" in capsys.readouterr().err


def test_restore_without_a_checkpoint_is_a_clear_error(tmp_path, state):
    with CheckpointManager(tmp_path, save_every=1, keep=1) as manager:
        assert manager.latest_step() is None
        with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
            manager.restore(*state)
    with pytest.raises(ValueError, match="save_every"):
        CheckpointManager(tmp_path, save_every=0, keep=1)


def _cut_largest_file(step_dir, size=1000):
    """Cut the biggest file of a checkpoint step to `size` bytes (or to half when it is smaller), as a full disk or
    a copy stopped short would."""
    largest = max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    os.truncate(largest, min(size, largest.stat().st_size // 2))
    return largest


@pytest.fixture(scope="module")
def big_state():
    """Params large enough that their data file is well over 1,000 bytes after compression."""
    params = {"w": jax.random.normal(jax.random.key(0), (64, 64)), "b": jnp.arange(8.0)}
    return params, {"m": jax.tree.map(jnp.zeros_like, params)}


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before_and_is_removed(tmp_path, big_state, capsys):
    params, opt_state = big_state
    with CheckpointManager(tmp_path, save_every=1, keep=3) as manager:
        for step in (1, 2, 3):
            manager.save(step, jax.tree.map(lambda x, s=step: x + s, params), opt_state, jax.random.key(step),
                         {"position": step})
    _cut_largest_file(tmp_path / "3")
    with CheckpointManager(tmp_path, save_every=1, keep=3) as manager:
        restored = manager.restore_latest(params, opt_state)
        assert restored.step == 2 and restored.loop_state == {"position": 2}
        np.testing.assert_array_equal(restored.params["w"], params["w"] + 2)
        assert manager.all_steps() == [1, 2]
        assert manager.save(3, params, opt_state, jax.random.key(3))  # the resumed run saves step 3 again
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"vlmgym: warning: checkpoint {tmp_path / '3'} cannot be restored (")
    assert lines[0].endswith("removed it, resuming from step 2")


def test_when_no_checkpoint_restores_the_error_names_the_folder_to_delete(tmp_path, big_state):
    params, opt_state = big_state
    with CheckpointManager(tmp_path, save_every=1, keep=3) as manager:
        assert manager.restore_latest(params, opt_state) is None  # an empty folder: a fresh start
        for step in (1, 2):
            manager.save(step, params, opt_state, jax.random.key(step))
    for step in (1, 2):
        _cut_largest_file(tmp_path / str(step))
    with CheckpointManager(tmp_path, save_every=1, keep=3) as manager:
        with pytest.raises(CheckpointDamaged) as err:
            manager.restore_latest(params, opt_state)
        assert manager.all_steps() == [1, 2]  # nothing removed: the user decides
    message = str(err.value)
    assert message.startswith(f"{tmp_path}: none of its checkpoints (steps 2, 1) can be restored (step 2: ")
    assert message.endswith("delete that folder to run this stage again from step 0") and "\n" not in message


def test_a_trainer_resumes_past_a_damaged_checkpoint_exactly(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from toy import ToyEnv, ToyPolicy

    from vlmgym.params import TrainParams, with_values
    from vlmgym.rl.grpo_trainer import GRPOTrainer

    policy = ToyPolicy()
    config = with_values(TrainParams(steps=4, batch_prompts=2, group_size=4), {
        "validation.every": 0, "validation.select": "last", "optimizer.lr": 0.02, "checkpointing.every": 1,
        "checkpointing.keep": 3})

    def trainer(name):
        return GRPOTrainer(policy, ToyEnv(), policy.init(jax.random.key(0)), config, tmp_path / name,
                           progress_bar=False)

    full = trainer("full")
    full.run()
    trainer("cut").run(stop_after=3)
    _cut_largest_file(tmp_path / "cut" / "3")
    resumed = trainer("cut")
    resumed.run()
    assert resumed.resumed_from == 2 and len(resumed.history) == 2
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(a, b)
