"""Every training loop stops at the first non-finite loss, gradient norm or param, naming the stage, the step and the
figure, and keeps its last good checkpoint: the bad state is never saved, logged or returned."""

import math

import jax
import numpy as np
import pytest
from toy import ToyEnv, ToyPolicy

from vlmgym.params import SFTParams, TrainParams, with_values
from vlmgym.rl import perception
from vlmgym.rl.checkpoint import CheckpointManager
from vlmgym.rl.dpo_trainer import DPOTrainer
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.loop import NonFiniteError, first_non_finite_leaf
from vlmgym.rl.ppo_trainer import PPOTrainer
from vlmgym.rl.sft_trainer import SFTTrainer

pytestmark = pytest.mark.slow

POLICY = ToyPolicy()
SETTINGS = {"validation.every": 0, "validation.select": "last", "optimizer.warmup_steps": 0,
            "optimizer.max_grad_norm": 0.0, "checkpointing.every": 1}
SFT = with_values(SFTParams(steps=4, batch_size=4), {**SETTINGS, "optimizer.lr": 0.03})
TRAIN = with_values(TrainParams(steps=4, batch_prompts=2, group_size=4), {**SETTINGS, "optimizer.lr": 0.02})
KINDS = {"sft": (SFTTrainer, SFT), "grpo": (GRPOTrainer, TRAIN),
         "rloo": (GRPOTrainer, with_values(TRAIN, {"algorithm": "rloo"})),
         "ppo": (PPOTrainer, with_values(TRAIN, {"algorithm": "ppo"})),
         "dpo": (DPOTrainer, with_values(TRAIN, {"algorithm": "online_dpo"}))}


def trainer_of(kind, folder, lr=None, logged=None):
    cls, config = KINDS[kind]
    if lr is not None:
        config = with_values(config, {"optimizer.lr": lr})
    callback = None if logged is None else (lambda step, metrics: logged.append(step))
    return cls(POLICY, ToyEnv(), POLICY.init(jax.random.key(0)), config, folder, progress_bar=False,
               metrics_callback=callback)


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_infinite_lr_stops_at_step_one_naming_the_params_and_saves_nothing(tmp_path, kind):
    logged = []
    trainer = trainer_of(kind, tmp_path / "run", lr=math.inf, logged=logged)
    with pytest.raises(NonFiniteError) as err:
        trainer.run()
    message = str(err.value)
    stage = "sft" if kind == "sft" else "train"
    assert message.startswith(f"{stage}: step 1: params hold inf or nan ("), message
    assert "no checkpoint was saved before it" in message and f"lower {stage}.optimizer.lr" in message
    assert "\n" not in message
    assert logged == [] and trainer.history == []  # the step's figures never reached MLflow or the curve
    assert CheckpointManager(tmp_path / "run", save_every=1, keep=2).all_steps() == []


def test_a_run_that_goes_bad_later_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    trainer_of("grpo", folder).run(stop_after=2)
    monkeypatch.chdir(tmp_path)  # the message shows the checkpoint relative to the working directory
    resumed = trainer_of("grpo", folder, lr=math.inf)
    with pytest.raises(NonFiniteError, match=r"^train: step 3: params hold inf or nan .* the last good checkpoint "
                                             r"is run/2; lower train.optimizer.lr"):
        resumed.run()
    assert resumed.resumed_from == 2
    assert CheckpointManager(folder, save_every=1, keep=2).all_steps() == [1, 2]


@pytest.mark.parametrize(("figure", "kind"), [("loss", "sft"), ("grad_norm", "ppo"), ("loss", "dpo")])
def test_a_non_finite_figure_is_named(tmp_path, figure, kind):
    trainer = trainer_of(kind, tmp_path / "run")
    step = trainer.step
    trainer.step = lambda index: {**step(index), **({figure: float("nan")} if index == 1 else {})}
    with pytest.raises(NonFiniteError, match=rf"step 2: {figure} is nan \(non-finite\); .* the last good checkpoint "
                                             rf"is .*run/1;"):
        trainer.run()
    assert [len(trainer.history)] == [1]
    assert CheckpointManager(tmp_path / "run", save_every=1, keep=2).all_steps() == [1]


def test_first_non_finite_leaf_names_the_array():
    tree = {"a": np.zeros(3, np.float32), "b": {"c": np.array([1.0, np.inf], np.float32)},
            "d": np.array([np.nan], np.float32), "steps": np.arange(3)}
    assert first_non_finite_leaf(tree) == ("['b']['c']", 2, 3)
    assert first_non_finite_leaf({"a": np.ones(2, np.float32), "steps": np.arange(3)}) is None


def test_the_perception_warm_up_stops_at_a_non_finite_lr(tiny_vlm, tmp_path):
    from test_perception import ColourEnv, colour_samples, policy_of

    env = ColourEnv(colour_samples(12, 0))
    section = SFTParams(steps=1, init_dir=tiny_vlm.folder, perception=with_values(
        SFTParams().perception, {"steps": 5, "optimizer.lr": math.inf, "optimizer.warmup_steps": 0, "batch_size": 6,
                                 "eval_every": 0}))
    logged = []
    with pytest.raises(NonFiniteError, match=r"^sft: perception warm-up step 1: params hold inf or nan .* lower "
                                             r"sft.perception.optimizer.lr"):
        perception.warm_up(policy_of(tiny_vlm), tiny_vlm.params, env, None, section, tmp_path,
                           log=lambda step, metrics: logged.append(step))
    assert logged == [] and not (tmp_path / "perception").exists()
