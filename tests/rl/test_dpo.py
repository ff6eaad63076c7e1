"""Online DPO: pair selection, the loss against its formula, learning on the toy env, exact resume."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy import ToyEnv, ToyPolicy

from vlmgym.params import TrainParams, with_values
from vlmgym.rl.dpo import dpo_loss, pair_rows, select_pairs
from vlmgym.rl.dpo_trainer import DPOTrainer
from vlmgym.rl.loop import TIMING_METRICS

POLICY = ToyPolicy()
DPO = with_values(TrainParams(algorithm="dpo", steps=12, batch_prompts=4, group_size=8), {
    "optimizer.lr": 0.02, "optimizer.warmup_steps": 0, "checkpointing.every": 4, "validation.every": 0,
    "validation.select": "last", "dpo.beta": 0.5})


def test_pairs_are_each_groups_best_and_worst_and_ties_are_invalid():
    pairs = select_pairs(np.array([0.1, 0.9, 0.9, 0.0, 0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 0.2]), group_size=4)
    np.testing.assert_array_equal(pairs.chosen, [1, 4, 8])  # the first of two equal best answers
    np.testing.assert_array_equal(pairs.rejected, [3, 4, 9])
    np.testing.assert_array_equal(pairs.valid, [True, False, True])
    np.testing.assert_array_equal(pair_rows(pairs), [1, 3, 4, 4, 8, 9])
    with pytest.raises(ValueError, match="whole groups"):
        select_pairs(np.zeros(5), group_size=4)


def test_loss_equals_the_dpo_formula():
    rng = np.random.default_rng(0)
    logprobs, reference = rng.normal(-1, 0.5, (6, 5)), rng.normal(-1, 0.5, (6, 5))
    mask = np.ones((6, 5))
    mask[1, 3:] = 0  # a shorter rejected answer: its padding must not count
    valid = np.array([True, True, False])
    beta = 0.3
    out = dpo_loss(jnp.asarray(logprobs), jnp.asarray(reference), jnp.asarray(mask), jnp.asarray(valid), beta=beta)
    sums = ((logprobs - reference) * mask).sum(axis=1)
    logits = sums[0::2] - sums[1::2]
    expected = np.log1p(np.exp(-beta * logits))[:2].mean()  # -log sigmoid(beta * logit), over the valid pairs
    assert float(out.loss) == pytest.approx(expected, rel=1e-5)
    assert float(out.margin_sum) == pytest.approx(beta * logits[:2].sum(), rel=1e-5)
    assert float(out.accuracy_sum) == float((logits[:2] > 0).sum())
    assert float(out.chosen_reward_sum) == pytest.approx(beta * sums[0:4:2].sum(), rel=1e-5)
    # The gradient raises the chosen answer's log-probs and lowers the rejected one's.
    grads = jax.grad(lambda lp: dpo_loss(lp, jnp.asarray(reference), jnp.asarray(mask), jnp.asarray(valid),
                                         beta=beta).loss)(jnp.asarray(logprobs))
    grads = np.asarray(grads)
    assert (grads[0] < 0).all() and (grads[1, :3] > 0).all() and (grads[1, 3:] == 0).all()
    assert (grads[4:] == 0).all()  # an invalid pair (a tie) contributes nothing


def _run(tmp_path, name, stop_after=None, **overrides):
    trainer = DPOTrainer(POLICY, ToyEnv(), POLICY.init(jax.random.key(0)), with_values(DPO, overrides),
                          tmp_path / name, progress_bar=False)
    trainer.run(stop_after=stop_after)
    return trainer


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("dpo"), "full")


def test_online_dpo_raises_the_reward_and_logs_its_figures(uninterrupted):
    history = uninterrupted.history
    rewards = [m["reward_mean"] for m in history]
    assert np.mean(rewards[-3:]) > rewards[0] + 0.15, rewards
    first = history[0]
    for name in ("dpo_margin", "dpo_accuracy", "dpo_chosen_reward", "dpo_rejected_reward", "dpo_pairs", "loss",
                 "logprob_mismatch_max", "grad_norm", "final_reward_mean"):
        assert np.isfinite(first[name]), name
    assert first["logprob_mismatch_max"] < 1e-4  # the pair rows' learner log-probs are the sampler's
    assert first["loss"] == pytest.approx(np.log(2), rel=1e-4)  # policy == reference at the first update
    assert first["dpo_pairs"] >= 1 and "clip_fraction_low" not in first and "kl_to_reference" not in first
    # Later, the policy prefers the chosen answers more than the start policy does.
    assert np.mean([m["dpo_margin"] for m in history[-4:]]) > 0
    assert uninterrupted.history[0]["compile_count"] == uninterrupted.history[-1]["compile_count"]


def test_killed_dpo_run_resumes_exactly(uninterrupted, tmp_path):
    _run(tmp_path, "resumed", stop_after=5)
    resumed = _run(tmp_path, "resumed")  # a new trainer: the reference is the start policy again, not step 4's
    assert resumed.resumed_from == 4
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(uninterrupted.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    strip = [{k: v for k, v in m.items() if k not in TIMING_METRICS} for m in resumed.history]
    assert strip == [{k: v for k, v in m.items() if k not in TIMING_METRICS} for m in uninterrupted.history[4:]]


def test_dpo_micro_batches_split_whole_pairs(tmp_path):
    whole = _run(tmp_path, "whole", steps=2)
    split = _run(tmp_path, "split", steps=2, micro_batches=2)
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(split.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    with pytest.raises(ValueError, match="micro_batches"):
        _run(tmp_path, "bad", micro_batches=3)
