"""Validation during training on the toy env and MLP policy: figures, best-checkpoint selection, early stopping,
exact resume, and the SFT validation loss."""


import jax
import numpy as np
import pytest
from toy import ToyEnv, ToyPolicy

from vlmgym.params import SFTParams, TrainParams, with_values
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.sft_trainer import SFTTrainer
from vlmgym.rl.validation import ValidationSettings, Validator

pytestmark = pytest.mark.slow

POLICY = ToyPolicy()
BASE = with_values(TrainParams(steps=6, batch_prompts=4, group_size=8, samples_every=5, num_samples=2), {
    "optimizer.lr": 0.02, "optimizer.warmup_steps": 0, "checkpointing.every": 4, "validation.every": 2,
    "validation.batch_size": 3, "validation.select": "best_val"})


def _params():
    return POLICY.init(jax.random.key(0))


def _trainer(folder, logged=None, **overrides):
    callback = None if logged is None else (lambda step, metrics: logged.append((step, metrics)))
    return GRPOTrainer(POLICY, ToyEnv(), _params(), with_values(BASE, overrides), folder,
                       progress_bar=False, val_env=ToyEnv(num_prompts=5), metrics_callback=callback)


def _greedy_reward(params, env):
    """The mean greedy reward at progress 1, computed directly (no padding, one batch)."""
    resets = [env.reset(i) for i in range(len(env))]
    samples = POLICY.greedy(params, [obs for _, obs in resets])
    rewards = []
    for (state, _), tokens, mask in zip(resets, samples.tokens, samples.mask):
        rewards.append(env.step(state, [int(t) for t, m in zip(tokens, mask) if m > 0])[2])
    return float(np.mean(rewards))


def test_grpo_validates_at_step_zero_every_n_steps_and_at_the_end(tmp_path):
    logged = []
    trainer = _trainer(tmp_path / "run", logged, steps=5)
    trainer.run()
    validated = [step for step, metrics in logged if "val/reward_greedy" in metrics]
    assert validated == [0, 2, 4, 5]
    first = logged[0][1]
    assert set(first) >= {"val/reward_greedy", "val/reward_sampled", "val/format_ok_rate", "val/best_step"}
    # Padding the last batch (5 prompts in batches of 3) does not change the figure.
    assert first["val/reward_greedy"] == pytest.approx(_greedy_reward(_params(), ToyEnv(num_prompts=5)))


def test_best_val_ends_on_the_best_validated_params(tmp_path):
    # a large lr: the greedy reward moves a lot between validations
    trainer = _trainer(tmp_path / "run", **{"optimizer.lr": 0.2})
    params = trainer.run()
    best_step = trainer.validator.best_step
    assert trainer.final_step == best_step
    assert _greedy_reward(params, ToyEnv(num_prompts=5)) == pytest.approx(trainer.validator.best_score)
    last = _trainer(tmp_path / "last", **{"optimizer.lr": 0.2, "validation.select": "last"})
    last_params = last.run()
    assert last.final_step == 6
    same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(last_params)))
    assert same == (best_step == 6)


def test_validator_selects_and_stops_on_scripted_scores(tmp_path):
    """Scores 0.1, 0.5, 0.3, 0.2: step 2 is best, two validations without a new best stop the run."""
    settings = ValidationSettings(every=2, batch_size=4, select="best_val", early_stop_patience=2)
    validator = Validator(POLICY, ToyEnv(), settings, tmp_path / "best")
    scores = iter([0.1, 0.5, 0.3, 0.2])
    validator.evaluate = lambda params: {"val/reward_greedy": next(scores)}
    snapshots = {step: jax.tree.map(lambda x, s=step: x + s, _params()) for step in (0, 2, 4, 6)}
    for step in (0, 2, 4):
        validator.validate(snapshots[step], step)
        assert validator.stopped_at is None
    figures = validator.validate(snapshots[6], 6)
    assert validator.stopped_at == 6 and validator.best_step == 2 and figures["val/best_reward_greedy"] == 0.5
    chosen, step = validator.selected(snapshots[6], 6)
    assert step == 2
    for a, b in zip(jax.tree.leaves(chosen), jax.tree.leaves(snapshots[2])):
        np.testing.assert_array_equal(a, b)
    # The state round-trips through JSON-safe data (checkpoints).
    again = Validator(POLICY, ToyEnv(), settings, tmp_path / "best")
    again.load_state(validator.state())
    assert again.state() == validator.state()


def test_early_stop_ends_the_run_and_a_restart_does_not_continue_it(tmp_path):
    scores = iter([0.5, 0.4, 0.3, 0.2, 0.1])

    def scripted(trainer):
        trainer.validator.evaluate = lambda params: {"val/reward_greedy": next(scores)}
        return trainer

    patient = {"validation.every": 1, "validation.early_stop_patience": 2}
    trainer = scripted(_trainer(tmp_path / "run", steps=10, **patient))
    params = trainer.run()
    assert len(trainer.history) == 2 and trainer.validator.stopped_at == 2 and trainer.final_step == 0
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(_params())):
        np.testing.assert_array_equal(a, b)  # step 0 (the start) was best
    restarted = scripted(_trainer(tmp_path / "run", steps=10, **patient))
    again = restarted.run()
    assert restarted.history == [] and restarted.resumed_from == 2 and restarted.final_step == 0
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


def test_a_resumed_run_validates_and_selects_exactly_as_an_uninterrupted_one(tmp_path):
    full_log, resumed_log = [], []
    full = _trainer(tmp_path / "full", full_log, **{"optimizer.lr": 0.2})
    full_params = full.run()
    interrupted = _trainer(tmp_path / "part", resumed_log, **{"optimizer.lr": 0.2})
    interrupted.run(stop_after=3)  # checkpoints at 2 (a validation step): resumes from there
    resumed = _trainer(tmp_path / "part", resumed_log, **{"optimizer.lr": 0.2})
    resumed_params = resumed.run()
    assert resumed.resumed_from == 2
    for a, b in zip(jax.tree.leaves(full_params), jax.tree.leaves(resumed_params)):
        np.testing.assert_array_equal(a, b)
    assert resumed.final_step == full.final_step

    def validations(log):
        return {step: {k: v for k, v in m.items() if k.startswith("val/")} for step, m in log if "val/best_step" in m}

    assert validations(resumed_log) == validations(full_log)


def test_sft_validation_loss_is_the_mean_token_nll_of_the_ideal_answers(tmp_path):
    config = with_values(SFTParams(steps=4, batch_size=3), {
        "optimizer.lr": 0.03, "optimizer.warmup_steps": 0, "checkpointing.every": 4, "validation.every": 2})
    val_env = ToyEnv(num_prompts=5)
    trainer = SFTTrainer(POLICY, ToyEnv(), _params(), config, tmp_path / "sft", progress_bar=False, val_env=val_env)
    loss = trainer.validation_loss(_params())["val/loss"]
    tokens, mask = POLICY.encode_targets([val_env.ideal_answer(val_env.reset(i)[0].meta) for i in range(5)])
    logprobs = np.asarray(POLICY.logprobs(_params(), {"prompt": np.arange(5), "tokens": tokens, "mask": mask}))
    assert loss == pytest.approx(-(logprobs * mask).sum() / mask.sum(), rel=1e-6)
    trainer.run()
    losses = [m["val/loss"] for m in trainer.history if "val/loss" in m]
    assert len(losses) == 2 and losses[-1] < loss  # steps 2 and 4; SFT on the same targets lowers it


class ReversedTargetEnv(ToyEnv):
    """SFT's target is the env's sft_target (e.g. the answer in R1 tags), not ideal_answer itself."""

    def sft_target(self, meta: dict) -> str:
        return " ".join(reversed(self.ideal_answer(meta).split()))


def test_sft_trains_and_validates_on_the_envs_sft_target(tmp_path):
    config = with_values(SFTParams(steps=1, batch_size=3), {
        "optimizer.lr": 0.03, "optimizer.warmup_steps": 0, "checkpointing.every": 4, "validation.every": 2})
    val_env = ReversedTargetEnv(num_prompts=5)
    trainer = SFTTrainer(POLICY, ReversedTargetEnv(), _params(), config, tmp_path / "sft", progress_bar=False,
                         val_env=val_env)
    targets = [val_env.sft_target(val_env.reset(i)[0].meta) for i in range(5)]
    assert targets[0] != val_env.ideal_answer(val_env.reset(0)[0].meta)
    tokens, mask = POLICY.encode_targets(targets)
    logprobs = np.asarray(POLICY.logprobs(_params(), {"prompt": np.arange(5), "tokens": tokens, "mask": mask}))
    assert trainer.validation_loss(_params())["val/loss"] == pytest.approx(-(logprobs * mask).sum() / mask.sum(),
                                                                           rel=1e-6)


def test_validation_settings_reject_selection_without_validation(tmp_path):
    with pytest.raises(ValueError, match="val_every > 0"):
        ValidationSettings(every=0, batch_size=4, select="best_val")
    with pytest.raises(ValueError, match="validation env"):
        GRPOTrainer(POLICY, ToyEnv(), _params(), BASE, tmp_path, progress_bar=False)
