"""PPO: token rewards, GAE, whitening and the clipped value loss against hand-computed values; the trainer on the
toy env (learning, exact resume, the detached critic never moving the policy)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy import ToyEnv, ToyPolicy

from vlmgym.params import TrainParams, with_values
from vlmgym.rl import ppo
from vlmgym.rl.loop import TIMING_METRICS, CompileCounter
from vlmgym.rl.ppo_trainer import PPOSettings, PPOTrainer, ppo_gradients

POLICY = ToyPolicy()
PPO = with_values(TrainParams(algorithm="ppo", steps=12, batch_prompts=4, group_size=8, samples_every=5, num_samples=2,
                              num_iterations=2), {
    "optimizer.lr": 0.02, "optimizer.warmup_steps": 0, "checkpointing.every": 4, "validation.every": 0,
    "validation.select": "last", "ppo.gamma": 1.0, "ppo.lam": 0.95})


def test_token_rewards_put_the_score_on_the_last_counted_token_and_the_kl_on_every_one():
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    rewards = ppo.token_rewards(np.array([0.5, 2.0, 9.0]), mask)
    np.testing.assert_allclose(rewards, [[0, 0, 0.5, 0], [2.0, 0, 0, 0], [0, 0, 0, 0]])
    logprobs = np.array([[-1.0, -2.0, -0.5, -7.0]] * 3)
    reference = np.array([[-1.5, -2.0, -0.25, 0.0]] * 3)
    with_kl = ppo.token_rewards(np.array([0.5, 2.0, 9.0]), mask, kl_coef=0.1, logprobs=logprobs,
                                reference_logprobs=reference)
    # -0.1 x (logp - logp_ref) = -0.1 x [0.5, 0, -0.25] on the first row's counted tokens
    np.testing.assert_allclose(with_kl[0], [-0.05, 0.0, 0.5 + 0.025, 0.0])
    np.testing.assert_allclose(with_kl[1], [2.0 - 0.05, 0, 0, 0])
    with pytest.raises(ValueError, match="reference_logprobs"):
        ppo.token_rewards(np.zeros(3), mask, kl_coef=0.1)


def test_gae_matches_a_hand_computation():
    # gamma 0.9, lambda 0.8 (gamma x lambda = 0.72).
    # Row 0: rewards [0, 0, 1], values [0.5, 0.2, 0.4]:
    #   t2: delta = 1 - 0.4 = 0.6                        A = 0.6
    #   t1: delta = 0.9 x 0.4 - 0.2 = 0.16               A = 0.16 + 0.72 x 0.6 = 0.592
    #   t0: delta = 0.9 x 0.2 - 0.5 = -0.32              A = -0.32 + 0.72 x 0.592 = 0.10624
    # Row 1: two counted tokens, reward 2 at t1, values [0.3, 0.1, junk]; past the end values count as 0:
    #   t1: delta = 2 - 0.1 = 1.9                        A = 1.9
    #   t0: delta = 0.9 x 0.1 - 0.3 = -0.21              A = -0.21 + 0.72 x 1.9 = 1.158
    rewards = np.array([[0, 0, 1.0], [0, 2.0, 0]])
    values = np.array([[0.5, 0.2, 0.4], [0.3, 0.1, 9.0]])
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
    advantages, returns = ppo.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(advantages, [[0.10624, 0.592, 0.6], [1.158, 1.9, 0.0]], atol=1e-12)
    np.testing.assert_allclose(returns, [[0.60624, 0.792, 1.0], [1.458, 2.0, 0.0]], atol=1e-12)
    # gamma = lambda = 1, values 0: every token's advantage is the episode's reward (REINFORCE)
    plain, _ = ppo.gae(rewards, np.zeros_like(values), mask, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(plain, [[1, 1, 1], [2, 2, 0]])


def test_whiten_over_counted_tokens():
    values = np.array([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
    out = ppo.whiten(values, mask)
    counted = out[mask > 0]
    assert counted.mean() == pytest.approx(0.0, abs=1e-12)
    assert counted.std(ddof=1) == pytest.approx(1.0, rel=1e-6)
    assert (out[mask == 0] == 0).all()


def test_value_loss_matches_a_hand_computation():
    # clipped = old + clip(V - old, +-0.2) = [0.7, 0.3]; errors: unclipped [1.0, 0.16], clipped [1.69, 0.01];
    # loss = 0.5 x mean(max) = 0.5 x (1.69 + 0.16) / 2 = 0.4625; the clipped term is chosen on the first token.
    out = ppo.value_loss(jnp.array([[1.0, 0.0, 5.0]]), jnp.array([[0.5, 0.5, 0.0]]), jnp.array([[2.0, 0.4, 0.0]]),
                         jnp.array([[1.0, 1.0, 0.0]]), clip=0.2)
    assert float(out.loss) == pytest.approx(0.4625, rel=1e-6)
    assert float(out.clip_fraction) == pytest.approx(0.5)
    # Its gradient: only the first token's clipped term is flat (the max picks it, and it is clipped), so only the
    # second token's value moves: d/dV2 of 0.5 x (V2 - 0.4)^2 / 2 = (0 - 0.4) / 2 = -0.2.
    grad = jax.grad(lambda v: ppo.value_loss(v, jnp.array([[0.5, 0.5, 0.0]]), jnp.array([[2.0, 0.4, 0.0]]),
                                             jnp.array([[1.0, 1.0, 0.0]]), clip=0.2).loss)(jnp.array([[1.0, 0.0, 5.0]]))
    np.testing.assert_allclose(np.asarray(grad), [[0.0, -0.2, 0.0]], atol=1e-7)


def _trainer(folder, **overrides):
    return PPOTrainer(POLICY, ToyEnv(), POLICY.init(jax.random.key(0)), with_values(PPO, overrides), folder,
                      progress_bar=False)


def test_ppo_raises_the_reward_on_the_toy_env_and_logs_its_figures(tmp_path):
    trainer = _trainer(tmp_path / "run")
    trainer.run()
    rewards = [m["reward_mean"] for m in trainer.history]
    assert np.mean(rewards[-3:]) > rewards[0] + 0.2, rewards
    for name in ("value_loss", "value_clip_fraction", "value_mean", "return_mean", "explained_variance",
                 "clip_fraction_low", "approx_kl_behaviour", "entropy", "grad_norm"):
        assert np.isfinite(trainer.history[-1][name]), name
    # The critic learns: its values start at 0 and come to track the returns, which follow the reward.
    assert trainer.history[0]["value_mean"] == 0.0
    late = trainer.history[-3:]
    assert np.mean([m["value_mean"] for m in late]) > 0.5 * np.mean([m["return_mean"] for m in late]) > 0.1
    assert set(trainer.params) == {"policy", "value"}
    assert float(jnp.abs(trainer.params["value"]["kernel"]).sum()) > 0


def test_ppo_resumes_exactly(tmp_path):
    full = _trainer(tmp_path / "full", steps=6)
    full_params = full.run()
    part = _trainer(tmp_path / "part", steps=6)
    part.run(stop_after=4)
    resumed = _trainer(tmp_path / "part", steps=6)
    resumed_params = resumed.run()
    assert resumed.resumed_from == 4
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(full_params), jax.tree.leaves(resumed_params)):
        np.testing.assert_array_equal(a, b)

    def deterministic(history):
        return [{k: v for k, v in m.items() if k not in TIMING_METRICS} for m in history]

    assert deterministic(full.history[4:]) == deterministic(resumed.history)


def test_the_detached_critic_never_moves_the_policy():
    """Policy gradients with a detached critic equal those without a value loss; with the shared head they
    differ (the value loss reaches the trunk)."""
    params = {"policy": POLICY.init(jax.random.key(0)),
              "value": {"kernel": jax.random.normal(jax.random.key(1), (POLICY.hidden,)), "bias": jnp.float32(0.3)}}
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, POLICY.vocab_size, (4, POLICY.max_new_tokens)).astype(np.int32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], np.float32)
    batch = POLICY.build_batch([{"prompt": p} for p in range(4)], tokens, mask)
    micro = {"batch": batch, "mask": mask, "behaviour": np.asarray(POLICY.logprobs(params["policy"], batch)) - 0.05,
             "advantages": rng.normal(size=mask.shape).astype(np.float32),
             "returns": rng.normal(size=mask.shape).astype(np.float32),
             "old_values": rng.normal(size=mask.shape).astype(np.float32)}
    from vlmgym.rl.optim import Optimizer, OptimizerConfig, trainable_mask

    optimizer = Optimizer(OptimizerConfig(), trainable_mask(params))

    def policy_grads(vf_coef, detached):
        settings = PPOSettings(epsilon=0.2, epsilon_high=0.28, aggregation="token_mean", vf_coef=vf_coef,
                               cliprange_value=10.0, detached=detached)
        _, grads, _ = ppo_gradients(params, micro, jnp.float32(mask.sum()), policy=POLICY, optimizer=optimizer,
                                    settings=settings, compiles=CompileCounter())
        return grads

    none, detached, shared = policy_grads(0.0, True), policy_grads(1.0, True), policy_grads(1.0, False)
    for a, b in zip(jax.tree.leaves(none["policy"]), jax.tree.leaves(detached["policy"])):
        np.testing.assert_array_equal(a, b)
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(none["policy"]),
                                                     jax.tree.leaves(shared["policy"])))
    # the value head learns in both
    assert float(jnp.abs(detached["value"]["kernel"]).sum()) > 0
    np.testing.assert_allclose(detached["value"]["kernel"], shared["value"]["kernel"], rtol=1e-6)


def test_ppo_rejects_grpo_kl_and_unknown_critics(tmp_path):
    with pytest.raises(ValueError, match=r"train.ppo.kl_coef"):
        _trainer(tmp_path / "a", **{"objective.beta": 0.1})
    with pytest.raises(ValueError, match=r"ppo.critic"):
        ppo.check_critic("separate")


def test_ppo_with_kl_in_the_reward_holds_a_reference_and_logs_the_kl(tmp_path):
    trainer = _trainer(tmp_path / "kl", steps=3, **{"ppo.kl_coef": 0.05})
    trainer.run()
    assert trainer.reference_params is not None
    assert trainer.history[0]["kl_to_reference"] == pytest.approx(0.0, abs=1e-5)  # the start policy is the reference
    assert trainer.history[-1]["kl_to_reference"] != 0.0
