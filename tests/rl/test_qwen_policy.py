"""Qwen3-VL as a Policy: on-policy log-probs, GRPO and SFT steps on geospot, frozen vision tower."""

import jax
import numpy as np
import pytest

from vlmgym.envs.geospot import GeospotEnv
from vlmgym.params import SFTParams, TrainParams, with_values
from vlmgym.rl.dpo_trainer import DPOTrainer
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.policy import Qwen3VLPolicy
from vlmgym.rl.sft_trainer import SFTTrainer
from vlmgym.rollout.sampling import SamplingSettings

pytestmark = pytest.mark.slow


def _policy(tiny_vlm, max_new_tokens, temperature=1.0):
    settings = SamplingSettings(max_new_tokens=max_new_tokens, eos_ids=tuple(tiny_vlm.processor.eos_token_ids),
                                pad_id=int(tiny_vlm.processor.pad_token_id), temperature=temperature)
    return Qwen3VLPolicy(tiny_vlm.cfg, tiny_vlm.processor, settings)


def _copy(params):
    # The trainers take ownership of (donate) the params they are given.
    return jax.tree.map(jax.numpy.copy, params)


def _env(tiny_vlm):
    return GeospotEnv(tiny_vlm.samples, tokenizer=tiny_vlm.processor.tokenizer)


class AnswerLengthEnv(GeospotEnv):
    """geospot observations with a reward a random tiny model already varies on: the answer's length."""

    def score(self, state, text):
        reward, info = super().score(state, text)
        length = min(len(text), 40) / 40
        return reward + length, {**info, "reward_components": {**info["reward_components"], "length": length}}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_learner_recomputes_the_sampler_logprobs(tiny_vlm, temperature):
    # At any temperature both sides score the tempered policy that sampled: the on-policy ratio is 1.
    policy = _policy(tiny_vlm, 8, temperature)
    env = _env(tiny_vlm)
    observations = [env.reset(i)[1] for i in range(2)]
    samples = policy.sample(tiny_vlm.params, observations, 3, jax.random.key(0))
    rows = [obs for obs in observations for _ in range(3)]
    batch = policy.build_batch(rows, samples.tokens, samples.mask)
    learner = np.asarray(jax.jit(policy.logprobs)(tiny_vlm.params, batch))
    np.testing.assert_allclose(learner, samples.logprobs, atol=2e-5)
    assert (learner[samples.mask == 0] == 0).all()


def test_grpo_steps_with_a_frozen_vision_tower(tiny_vlm, tmp_path):
    config = with_values(TrainParams(steps=2, batch_prompts=2, group_size=2, max_new_tokens=8, freeze="vision"), {
        "optimizer.lr": 1e-2, "validation.every": 0, "validation.select": "last", "optimizer.warmup_steps": 0,
        "checkpointing.every": 1})
    env = AnswerLengthEnv(tiny_vlm.samples, tokenizer=tiny_vlm.processor.tokenizer)
    trainer = GRPOTrainer(_policy(tiny_vlm, config.max_new_tokens), env, _copy(tiny_vlm.params), config,
                          tmp_path / "grpo", progress_bar=False)
    params = trainer.run()
    for a, b in zip(jax.tree.leaves(params["visual"]), jax.tree.leaves(tiny_vlm.params["visual"])):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
    changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params["text"]),
                                                        jax.tree.leaves(tiny_vlm.params["text"]))]
    assert any(changed)
    first, second = trainer.history
    assert "reward/length" in first and first["reward_std"] > 0 and first["grad_norm"] > 0
    assert first["logprob_mismatch_max"] < 1e-4  # the ratio is 1 up to float rounding on the first iteration
    assert first["clip_fraction_low"] == first["clip_fraction_high"] == 0.0
    # Same bucketed shapes: neither the learner nor the rollout engine compiles again in the second step.
    assert second["compile_count"] == first["compile_count"]
    assert second["rollout_compile_count"] == first["rollout_compile_count"] > 0
    assert trainer.checkpoints.all_steps() == [1, 2]


def test_sft_lowers_the_loss_on_ideal_answers(tiny_vlm, tmp_path):
    config = with_values(SFTParams(steps=4, batch_size=2, max_target_tokens=56), {
        "validation.every": 0, "optimizer.lr": 3e-3, "optimizer.warmup_steps": 0, "checkpointing.every": 4})
    policy = _policy(tiny_vlm, config.max_target_tokens)
    tokens, mask = policy.encode_targets(["Country: France"])
    assert tokens[0, int(mask.sum()) - 1] == policy.end_of_turn
    trainer = SFTTrainer(policy, _env(tiny_vlm), _copy(tiny_vlm.params), config, tmp_path / "sft", progress_bar=False)
    trainer.run()
    losses = [m["loss"] for m in trainer.history]
    assert losses[-1] < losses[0], losses
    with pytest.raises(ValueError, match="max_new_tokens"):
        _policy(tiny_vlm, 4).encode_targets(["Country: France\nRegion: Ile-de-France"])


def test_one_update_moves_a_rollouts_logprob_in_its_advantages_direction(tiny_vlm):
    # The real Qwen policy, a fixed sampled rollout, one GRPO update: a positive advantage must raise the rollout's
    # log-prob and a negative one lower it (a sign, masking or alignment bug anywhere would break one of the two).
    # Both signs in one test: they share the rollout and every compiled program.
    from vlmgym.params import ObjectiveParams
    from vlmgym.rl.loop import CompileCounter
    from vlmgym.rl.optim import Optimizer, OptimizerConfig, trainable_mask
    from vlmgym.rl.update import apply_update, grpo_gradients

    policy = _policy(tiny_vlm, 8)
    env = _env(tiny_vlm)
    observations = [env.reset(0)[1]]
    samples = policy.sample(tiny_vlm.params, observations, 1, jax.random.key(1))
    assert samples.mask.sum() > 1
    batch = policy.build_batch(observations, samples.tokens, samples.mask)
    logprobs = jax.jit(policy.logprobs)
    before = float(np.asarray(logprobs(tiny_vlm.params, batch)).sum())
    optimizer = Optimizer(OptimizerConfig(learning_rate=1e-3, warmup_steps=0, total_steps=10, end_lr_ratio=1.0),
                          trainable_mask(tiny_vlm.params))
    objective = ObjectiveParams(epsilon=0.2, epsilon_high=0.28, loss_aggregation="token_mean", beta=0.0)
    compiles = CompileCounter()
    init = jax.jit(optimizer.init)  # one wrapper: a bound method read twice would be traced and compiled twice
    for sign in (1.0, -1.0):
        params = _copy(tiny_vlm.params)
        micro = {"batch": batch, "behaviour": samples.logprobs, "advantages": np.array([sign], np.float32),
                 "mask": samples.mask}
        _, grads, _ = grpo_gradients(params, micro, jax.numpy.float32(samples.mask.sum()), policy=policy,
                                     optimizer=optimizer, objective=objective, compiles=compiles)
        params, _, _ = apply_update(params, init(params), grads, optimizer=optimizer, compiles=compiles)
        after = float(np.asarray(logprobs(params, batch)).sum())
        assert (after - before) * sign > 1e-3, (sign, before, after)


def test_online_dpo_steps_on_the_real_policy(tiny_vlm, tmp_path):
    config = with_values(TrainParams(algorithm="dpo", steps=2, batch_prompts=2, group_size=4, max_new_tokens=8), {
        "optimizer.lr": 1e-2, "validation.every": 0, "validation.select": "last", "optimizer.warmup_steps": 0,
        "checkpointing.every": 1, "dpo.beta": 0.5})
    env = AnswerLengthEnv(tiny_vlm.samples, tokenizer=tiny_vlm.processor.tokenizer)
    trainer = DPOTrainer(_policy(tiny_vlm, config.max_new_tokens), env, _copy(tiny_vlm.params), config,
                         tmp_path / "dpo", progress_bar=False)
    trainer.run()
    first, second = trainer.history
    assert first["dpo_pairs"] == 2  # answer lengths differ within each group
    assert first["logprob_mismatch_max"] < 1e-4 and first["loss"] == pytest.approx(np.log(2), rel=1e-4)
    # After one update the policy is no longer the reference: the loss moved off log 2.
    assert second["loss"] != first["loss"] and np.isfinite(second["dpo_margin"])
    assert second["compile_count"] == first["compile_count"]


@pytest.mark.parametrize("critic", ["head", "detached"])
def test_ppo_steps_on_the_real_policy(tiny_vlm, tmp_path, critic):
    from vlmgym.rl.ppo_trainer import PPOTrainer

    config = with_values(TrainParams(algorithm="ppo", steps=2, batch_prompts=2, group_size=2, max_new_tokens=8), {
        "optimizer.lr": 1e-2, "validation.every": 0, "validation.select": "last", "optimizer.warmup_steps": 0,
        "checkpointing.every": 1, "ppo.critic": critic})
    env = AnswerLengthEnv(tiny_vlm.samples, tokenizer=tiny_vlm.processor.tokenizer)
    trainer = PPOTrainer(_policy(tiny_vlm, config.max_new_tokens), env, _copy(tiny_vlm.params), config,
                         tmp_path / "ppo", progress_bar=False)
    params = trainer.run()
    first, second = trainer.history
    assert first["logprob_mismatch_max"] < 1e-4 and first["value_mean"] == 0.0  # zero-initialised head
    assert first["value_loss"] > 0 and second["value_mean"] != 0.0  # the head learned from the first step
    assert trainer.params["value"]["kernel"].shape == (tiny_vlm.cfg.text.hidden_size,)
    assert jax.tree.structure(params) == jax.tree.structure(tiny_vlm.params)  # the policy alone comes back
    assert second["compile_count"] == first["compile_count"]


def test_features_of_the_shared_prefix_forward_equal_the_per_copy_ones(tiny_vlm):
    policy = _policy(tiny_vlm, 8)
    env = _env(tiny_vlm)
    observations = [env.reset(i)[1] for i in range(2)]
    samples = policy.sample(tiny_vlm.params, observations, 3, jax.random.key(0))
    shared = policy.build_batch(observations, samples.tokens, samples.mask)
    per_copy = policy.build_batch([obs for obs in observations for _ in range(3)], samples.tokens, samples.mask)
    score = jax.jit(policy.logprobs_and_features)
    (shared_lp, shared_features), (copy_lp, copy_features) = score(tiny_vlm.params, shared), score(tiny_vlm.params,
                                                                                                    per_copy)
    np.testing.assert_allclose(shared_lp, copy_lp, atol=1e-5)
    active = samples.mask > 0
    np.testing.assert_allclose(np.asarray(shared_features)[active], np.asarray(copy_features)[active], atol=1e-4)
    np.testing.assert_array_equal(np.asarray(shared_lp), np.asarray(jax.jit(policy.logprobs)(tiny_vlm.params, shared)))
