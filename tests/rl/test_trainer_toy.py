"""The GRPO and SFT loops on the toy env and MLP policy: learning, on-policy ratios, resume, frozen subsets."""

import dataclasses

import jax
import numpy as np
import pytest
from toy import ToyEnv, ToyPolicy

from vlmgym.eval.curve import component_metric
from vlmgym.params import SFTParams, TrainParams, with_values
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.loop import TIMING_METRICS
from vlmgym.rl.sft_trainer import SFTTrainer

pytestmark = pytest.mark.slow

POLICY = ToyPolicy()
BASE = with_values(TrainParams(steps=10, batch_prompts=4, group_size=8, samples_every=5, num_samples=3), {
    "validation.every": 0, "validation.select": "last", "optimizer.lr": 0.02, "optimizer.warmup_steps": 0,
    "checkpointing.every": 3})
# Wall-clock figures differ between runs; everything else must match exactly.


def _params(dtype=None):
    params = POLICY.init(jax.random.key(0))
    return params if dtype is None else jax.tree.map(lambda x: x.astype(dtype), params)


def _run(tmp_path, name, stop_after=None, **overrides):
    trainer = GRPOTrainer(POLICY, ToyEnv(), _params(), with_values(BASE, overrides), tmp_path / name,
                          progress_bar=False)
    trainer.run(stop_after=stop_after)
    return trainer


def _deterministic(history):
    return [{k: v for k, v in m.items() if k not in TIMING_METRICS} for m in history]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    rows = []
    trainer = GRPOTrainer(POLICY, ToyEnv(), _params(), BASE, tmp_path_factory.mktemp("ckpt") / "full",
                          samples_callback=lambda step, table: rows.append((step, table)), progress_bar=False)
    trainer.run()
    return trainer, rows


def test_grpo_raises_the_reward_and_logs_every_figure(uninterrupted):
    trainer, sample_tables = uninterrupted
    rewards = [m["reward_mean"] for m in trainer.history]
    assert np.mean(rewards[-3:]) > rewards[0] + 0.2, rewards
    first = trainer.history[0]
    for name in ("reward_std", "reward/match", "reward/stops", "zero_std_group_share", "clip_fraction_low",
                 "clip_fraction_high", "approx_kl_behaviour", "entropy", "completion_length", "logprob_mismatch_mean",
                 "grad_norm", "learning_rate", "tokens_per_s", "step_time_s", "compile_count"):
        assert np.isfinite(first[name]), name
    assert "kl_to_reference" not in first  # beta = 0: no reference policy, no figure pretending otherwise
    # the evaluate stage finds a reward component's curve under this name (the report's per-level curves)
    assert component_metric("match") in first and component_metric("stops") in first
    assert first["learning_rate"] == pytest.approx(0.02)
    # Two compiles for the whole run (gradients, optimizer step), never one per step.
    assert trainer.history[0]["compile_count"] == trainer.history[-1]["compile_count"] == 2.0
    assert [step for step, _ in sample_tables] == [1, 5, 10]
    assert len(sample_tables[0][1]) == 3 and {"answer", "reward", "reward_components"} <= set(sample_tables[0][1][0])


def test_first_on_policy_iteration_has_ratio_one_and_no_clipping(uninterrupted, tmp_path):
    # Against the sampler's plain-softmax log-probs the ratio is 1 up to float rounding of a different program.
    for metrics in uninterrupted[0].history:
        assert metrics["logprob_mismatch_max"] < 1e-5
        assert abs(metrics["ratio_max"] - 1) < 1e-5 and abs(metrics["ratio_min"] - 1) < 1e-5
        assert metrics["clip_fraction_low"] == 0.0 and metrics["clip_fraction_high"] == 0.0
    # Against the learner's own recomputation it is exactly 1.
    for metrics in _run(tmp_path, "learner", steps=2, old_logprobs="learner").history:
        assert metrics["ratio_mean"] == 1.0 and metrics["ratio_max"] == 1.0 and metrics["ratio_min"] == 1.0
        assert metrics["clip_fraction_low"] == 0.0 and metrics["clip_fraction_high"] == 0.0
        assert metrics["approx_kl_behaviour"] == 0.0


def test_killed_run_resumes_exactly(uninterrupted, tmp_path):
    first = _run(tmp_path, "resumed", stop_after=5)  # killed after step 5; the last checkpoint is step 3
    assert first.checkpoints.all_steps() == [3]
    second = _run(tmp_path, "resumed")
    assert second.resumed_from == 3
    expected = _deterministic(uninterrupted[0].history)
    assert _deterministic(first.history) == expected[:5]
    assert _deterministic(second.history) == expected[3:]
    for a, b in zip(jax.tree.leaves(second.params), jax.tree.leaves(uninterrupted[0].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The checkpoint carries the metrics before it: a run restarted after its last step still reports them.
    assert _deterministic(second.restored_history) == expected[:3]
    finished = _run(tmp_path, "resumed")
    assert finished.resumed_from == 10 and finished.history == []
    assert _deterministic(finished.restored_history) == expected


def test_learner_logprobs_and_extra_iterations_clip(tmp_path):
    trainer = _run(tmp_path, "iterations", steps=2, num_iterations=3, old_logprobs="learner", micro_batches=2,
                   **{"objective.epsilon": 0.01, "objective.epsilon_high": 0.01, "optimizer.lr": 0.05})
    # Later iterations are off-policy: the tiny clip range is hit.
    assert max(m["clip_fraction_low"] + m["clip_fraction_high"] for m in trainer.history) > 0
    assert all(m["approx_kl_behaviour"] > 0 for m in trainer.history)


def test_gradient_accumulation_matches_the_full_batch(tmp_path):
    whole = _run(tmp_path, "whole", steps=1)
    accumulated = _run(tmp_path, "accumulated", steps=1, micro_batches=4)
    for name in ("loss", "grad_norm", "policy_loss", "reward_mean"):
        assert accumulated.history[0][name] == pytest.approx(whole.history[0][name], rel=1e-5), name


def test_frozen_vision_subset_stays_bit_identical(tmp_path):
    trainer = _run(tmp_path, "frozen", steps=3, freeze="vision")
    initial = _params()
    for a, b in zip(jax.tree.leaves(trainer.params["visual"]), jax.tree.leaves(initial["visual"])):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
    assert not np.array_equal(np.asarray(trainer.params["out"]["w"]), np.asarray(initial["out"]["w"]))


def test_group_filtering_resamples_and_counts(tmp_path):
    trainer = _run(tmp_path, "filtered", steps=4, filter_groups=True, max_sample_rounds=3, **{"optimizer.lr": 0.2})
    history = trainer.history
    # The policy sharpens fast at this lr, so all-equal groups appear and are dropped and replaced.
    assert sum(m["groups_dropped"] for m in history) > 0
    assert any(m["sample_rounds"] > 1 for m in history)
    for m in history:
        assert m["groups_dropped"] == pytest.approx(m["zero_std_group_share"] * m["sample_rounds"] * 4)


def test_kl_to_reference_when_beta_is_on(tmp_path):
    trainer = _run(tmp_path, "kl", steps=3, **{"objective.beta": 0.1})
    kl = [m["kl_to_reference"] for m in trainer.history]
    assert kl[0] == 0.0  # the reference is the starting policy
    assert kl[-1] > 0.0


def test_sft_learns_the_ideal_answers(tmp_path):
    config = with_values(SFTParams(steps=25, batch_size=8), {
        "validation.every": 0, "optimizer.lr": 0.03, "optimizer.warmup_steps": 0, "checkpointing.every": 25})
    trainer = SFTTrainer(POLICY, ToyEnv(), _params(), config, tmp_path / "sft", progress_bar=False)
    trainer.run()
    losses = [m["loss"] for m in trainer.history]
    assert losses[-1] < 0.3 * losses[0], losses
    assert trainer.history[0]["target_length"] == 4.0  # three answer tokens + EOS
    # The fine-tuned policy's samples now score high under the GRPO env.
    samples = POLICY.sample(trainer.params, [ToyEnv().reset(i)[1] for i in range(8)], 4, jax.random.key(1))
    env = ToyEnv()
    rewards = [env.step(env.reset(i // 4)[0], [int(t) for t, m in zip(row, mask) if m])[2]
               for i, (row, mask) in enumerate(zip(samples.tokens, samples.mask))]
    assert np.mean(rewards) > 0.8


class LongFirstPrompt(ToyEnv):
    """Prompt 0's ideal answer does not fit the token budget."""

    def ideal_answer(self, meta):
        return "1 2 3 4 5 6" if meta["prompt"] == 0 else super().ideal_answer(meta)


def test_sft_skips_and_counts_targets_over_the_token_budget(tmp_path):
    config = with_values(SFTParams(steps=2, batch_size=8), {
        "validation.every": 0, "optimizer.lr": 0.03, "optimizer.warmup_steps": 0, "checkpointing.every": 2})
    trainer = SFTTrainer(POLICY, LongFirstPrompt(), _params(), config, tmp_path / "sft", progress_bar=False)
    trainer.run()
    # 8 prompts per epoch, one of them too long: every step still trains on a full batch.
    assert sum(m["targets_skipped"] for m in trainer.history) >= 1
    assert all(m["tokens"] == 8 * 4 for m in trainer.history)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SFTTrainer(dataclasses.replace(POLICY, max_new_tokens=3), ToyEnv(), _params(), config, tmp_path / "short",
                   progress_bar=False).run()


def test_the_lr_schedule_spans_every_update_of_every_iteration(tmp_path):
    # A GRPO step makes num_iterations updates; the cosine must end at the last step, not a third of the way in.
    trainer = _run(tmp_path, "schedule", steps=4, num_iterations=3,
                   **{"optimizer.warmup_steps": 1, "optimizer.end_lr_ratio": 0.1, "optimizer.lr": 0.02})
    assert (trainer.optimizer.config.total_steps, trainer.optimizer.config.warmup_steps) == (12, 3)
    rates = [m["learning_rate"] for m in trainer.history]  # each step's mean over its three updates
    schedule = trainer.optimizer.schedule
    expected = [np.mean([float(schedule(3 * step + i)) for i in range(3)]) for step in range(4)]
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    # The old schedule (length 4) sat at the end lr from the second step on; this one is still decaying.
    assert rates[2] > 2 * 0.02 * 0.1 and rates[1] > rates[2] > rates[3]


class CurriculumToyEnv(ToyEnv):
    """The toy reward with a curriculum: the stop bonus only counts from progress 0.5 on."""

    def score(self, state, text):
        reward, info = super().score(state, text)
        stops = info["reward_components"]["stops"]
        return (reward if self.progress >= 0.5 else reward - 0.25 * stops), info


def test_final_weights_reward_is_logged_beside_the_reward_as_trained(tmp_path):
    trainer = GRPOTrainer(POLICY, CurriculumToyEnv(), _params(), dataclasses.replace(BASE, steps=4),
                          tmp_path / "curriculum", progress_bar=False)
    trainer.run()
    early, late = trainer.history[0], trainer.history[-1]  # progress 0 and 0.75
    # Early on the curriculum withholds the stop bonus: the reward as trained is below the final-weights one by
    # exactly a quarter of the stop share; once the curriculum reaches its end the two agree.
    assert early["final_reward_mean"] == pytest.approx(early["reward_mean"] + 0.25 * early["reward/stops"])
    assert early["reward/stops"] > 0
    assert late["final_reward_mean"] == pytest.approx(late["reward_mean"])
    assert trainer.env.progress == pytest.approx(3 / 4)  # scoring at progress 1 left the env's progress alone


def test_rloo_learns_and_takes_exactly_the_leave_one_out_step(tmp_path, uninterrupted):
    # RLOO's advantages are GRPO's (scale_rewards none) times G / (G - 1): with plain SGD-like scaling the first
    # update differs, and the run learns like GRPO does.
    rloo = _run(tmp_path, "rloo", algorithm="rloo")
    rewards = [m["reward_mean"] for m in rloo.history]
    assert np.mean(rewards[-3:]) > rewards[0] + 0.2, rewards
    grpo_none = _run(tmp_path, "none", steps=1, **{"objective.scale_rewards": "none"})
    rloo_none = _run(tmp_path, "rloo_none", steps=1, algorithm="rloo", **{"objective.scale_rewards": "none"})
    # Same samples at step 1 (same seed, same start): the same rewards, a larger advantage magnitude.
    assert rloo_none.history[0]["reward_mean"] == grpo_none.history[0]["reward_mean"]
    assert rloo_none.history[0]["grad_norm"] == pytest.approx(grpo_none.history[0]["grad_norm"] * 8 / 7, rel=1e-4)


def test_the_data_wait_is_logged_and_prefetching_changes_nothing(uninterrupted, tmp_path, monkeypatch):
    first = uninterrupted[0].history[0]
    assert "data_wait_s" in first and first["data_wait_s"] >= 0.0
    # Without the background thread (every reset inline), the same run gives the same figures and weights.
    from vlmgym.rl import prefetch

    monkeypatch.setattr(prefetch.ResetPrefetcher, "ahead", lambda self, indices: None)
    inline = _run(tmp_path, "inline")
    assert _deterministic(inline.history) == _deterministic(uninterrupted[0].history)
    for a, b in zip(jax.tree.leaves(inline.params), jax.tree.leaves(uninterrupted[0].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
