"""The GRPO trainer uses each objective knob: truncated answers leave the loss, the overlong penalty enters the reward,
filter_metric picks the groups, the sampler correction reweighs a deliberately perturbed sampler, GSPO clips."""

import dataclasses

import jax
import numpy as np
import pytest
from toy import ToyEnv, ToyPolicy

from vlmgym.params import ObjectiveParams, ParamsError, TrainParams, with_values
from vlmgym.rl import grpo, grpo_trainer
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.loop import Samples

pytestmark = pytest.mark.slow

POLICY = ToyPolicy()
BASE = with_values(TrainParams(steps=2, batch_prompts=4, group_size=8, samples_every=100, num_samples=1,
                               max_new_tokens=POLICY.max_new_tokens), {
    "validation.every": 0, "validation.select": "last", "optimizer.lr": 0.02, "optimizer.warmup_steps": 0,
    "checkpointing.every": 100})


def _trainer(tmp_path, name, policy=POLICY, **overrides):
    return GRPOTrainer(policy, ToyEnv(), policy.init(jax.random.key(0)), with_values(BASE, overrides),
                       tmp_path / name, progress_bar=False)


@pytest.fixture
def micro_spy(monkeypatch):
    """Every micro-batch the trainer differentiates, with its normalizer."""
    seen = []
    real = grpo_trainer.grpo_gradients

    def spy(params, micro, normalizer, **kwargs):
        seen.append((jax.device_get({k: v for k, v in micro.items() if k != "batch"}), float(normalizer),
                     jax.device_get(micro["batch"]["tokens"]), jax.device_get(micro["batch"]["mask"])))
        return real(params, micro, normalizer, **kwargs)

    monkeypatch.setattr(grpo_trainer, "grpo_gradients", spy)
    return seen


def test_truncated_answers_carry_no_loss_but_keep_their_reward(tmp_path, micro_spy):
    trainer = _trainer(tmp_path, "masked", steps=1, **{"objective.mask_truncated_completions": True})
    trainer.run()
    (micro, normalizer, tokens, sampled_mask), = micro_spy
    truncated = grpo.truncated_rows(tokens, sampled_mask, POLICY.eos_ids)
    assert 0 < truncated.sum() < len(truncated)  # the toy policy's first answers: some stop, some run out
    assert np.all(micro["mask"][truncated] == 0)
    np.testing.assert_array_equal(micro["mask"][~truncated], sampled_mask[~truncated])
    assert normalizer == micro["mask"].sum()  # token_mean over the answers that still count
    # Advantages came from every answer's reward: the truncated ones' are not all zero.
    assert np.any(micro["advantages"][truncated] != 0)
    assert trainer.history[0]["truncated_share"] == pytest.approx(truncated.mean())


def test_the_overlong_penalty_enters_the_reward(tmp_path, micro_spy):
    plain = _trainer(tmp_path, "plain", steps=1)
    plain.run()
    penalised = _trainer(tmp_path, "penalised", steps=1,
                         **{"objective.overlong_buffer": 2, "objective.overlong_penalty": 0.5})
    penalised.run()
    (_, _, tokens, mask), (micro, _, _, _) = micro_spy
    lengths = mask.sum(axis=1)
    expected = grpo.soft_overlong_penalty(lengths, POLICY.max_new_tokens, 2, 0.5)
    assert expected.min() < 0  # the toy answers reach the buffer
    first, second = plain.history[0], penalised.history[0]  # the same samples: the same start, rng and data
    assert second["overlong_penalty"] == pytest.approx(expected.mean())
    assert second["reward_mean"] == pytest.approx(first["reward_mean"] + expected.mean())
    assert "overlong_penalty" not in first


def test_filter_metric_keeps_exactly_the_groups_whose_metric_varies(tmp_path):
    trainer = _trainer(tmp_path, "filtered", filter_groups=True, filter_metric="stops", max_sample_rounds=3,
                       batch_prompts=8)
    batch = _first_batch(trainer, jax.random.key(5))
    kept = batch.groups[: len(batch.groups) - batch.num_padding]
    stops = [np.array([i["reward_components"]["stops"] for i in g.infos]) for g in kept]
    assert kept and all(values.std() > 0 for values in stops)
    sampled = np.array([i["reward_components"]["stops"] for i in batch.sampled.infos]).reshape(-1, 8)
    flat = int((sampled.std(axis=1) == 0).sum())
    assert batch.groups_filtered == flat > 0
    # Filtering on the total reward keeps a different set here: the choice of metric matters.
    by_reward = _trainer(tmp_path, "by_reward", filter_groups=True, max_sample_rounds=3, batch_prompts=8)
    other = _first_batch(by_reward, jax.random.key(5))
    assert other.groups_filtered != batch.groups_filtered


def test_an_unknown_filter_metric_names_what_the_env_reports(tmp_path):
    trainer = _trainer(tmp_path, "unknown", filter_groups=True, filter_metric="correct")
    with pytest.raises(ValueError, match="'correct'.*they report: match, stops"):
        _first_batch(trainer, jax.random.key(0))


def _first_batch(trainer, rng):
    """The batch the trainer's sampler draws for step 0 with `rng`."""
    return trainer.sampler.batch(trainer.model_params(), 0.0, rng)


@dataclasses.dataclass(frozen=True)
class OffsetSampler(ToyPolicy):
    """The toy policy whose sampler reports every log-prob `offset` lower than the learner computes (a sampler
    that disagrees with the learner, as bf16 sampling does on a GPU)."""

    offset: float = 0.5

    def sample(self, params, observations, group_size, rng):
        samples = super().sample(params, observations, group_size, rng)
        return Samples(tokens=samples.tokens, mask=samples.mask, texts=samples.texts,
                       logprobs=np.where(samples.mask > 0, samples.logprobs - self.offset, 0.0).astype(np.float32))


def test_the_sampler_correction_reweighs_a_perturbed_sampler(tmp_path):
    policy = OffsetSampler()
    truncated = _trainer(tmp_path, "tis", policy, steps=1, old_logprobs="learner",
                         **{"objective.sampler_correction": "token_truncate"})
    truncated.run()
    # learner / sampler = e^0.5 on every token, under the cap of 3: every weight is e^0.5.
    assert truncated.history[0]["sampler_weight_mean"] == pytest.approx(np.exp(0.5), rel=1e-5)
    assert truncated.history[0]["sampler_weight_zero"] == 0
    plain = _trainer(tmp_path, "plain", policy, steps=1, old_logprobs="learner")
    plain.run()
    assert truncated.history[0]["policy_loss"] == pytest.approx(np.exp(0.5) * plain.history[0]["policy_loss"],
                                                                rel=1e-4)
    # Masked at a cap of 1.5, every token is out (e^0.5 = 1.65): no loss, no gradient, the weights stay.
    masked = _trainer(tmp_path, "mis", policy, steps=1, old_logprobs="learner",
                      **{"objective.sampler_correction": "token_mask", "objective.sampler_correction_cap": 1.5})
    start = policy.init(jax.random.key(0))
    masked.run()
    assert masked.history[0]["sampler_weight_zero"] == 1.0 and masked.history[0]["policy_loss"] == 0.0
    for a, b in zip(jax.tree.leaves(masked.params), jax.tree.leaves(start)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_gspo_clips_by_the_sequence_ratio_in_later_iterations(tmp_path):
    runs = {level: _trainer(tmp_path, level, steps=2, num_iterations=3, old_logprobs="learner",
                            **{"objective.epsilon": 0.01, "objective.epsilon_high": 0.01,
                               "objective.importance_sampling_level": level, "optimizer.lr": 0.05})
            for level in ("token", "sequence", "sequence_token")}
    for trainer in runs.values():
        trainer.run()
    for level, trainer in runs.items():
        assert max(m["clip_fraction_low"] + m["clip_fraction_high"] for m in trainer.history) > 0, level
    assert runs["sequence"].history[-1]["loss"] != runs["token"].history[-1]["loss"]
    # GSPO-token has GSPO's value and clipping: the same losses, step for step.
    for a, b in zip(runs["sequence"].history, runs["sequence_token"].history):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"objective.sampler_correction": "token_mask"}, "set train.old_logprobs: learner"),
    ({"algorithm": "ppo", "objective.importance_sampling_level": "sequence"}, "does not use"),
    ({"algorithm": "dpo", "objective.mask_truncated_completions": True}, "does not use"),
    ({"objective.overlong_buffer": 65}, "longer than train.max_new_tokens"),
])
def test_knobs_that_cannot_apply_are_refused(overrides, message):
    with pytest.raises(ParamsError, match=message):
        with_values(TrainParams(), overrides)


def test_the_knobs_choices_are_the_losses():
    fields = {f.name: f for f in dataclasses.fields(ObjectiveParams)}
    assert fields["importance_sampling_level"].metadata["choices"] == grpo.IMPORTANCE_SAMPLING_LEVELS
    assert fields["sampler_correction"].metadata["choices"] == grpo.SAMPLER_CORRECTIONS


@pytest.mark.parametrize("quantile", [0.0, 0.3])
def test_only_the_high_entropy_tokens_carry_the_loss(tmp_path, quantile):
    whole = _trainer(tmp_path, "whole", steps=1)
    whole.run()
    top = _trainer(tmp_path, f"top{quantile}", steps=1, **{"objective.top_entropy_quantile": quantile})
    top.run()
    kept = top.history[0]["entropy_kept"]
    tokens = whole.history[0]["completion_length"] * BASE.batch_prompts * BASE.group_size
    # The toy policy's first position has one entropy per prompt: a group's rows tie there (ties are all kept).
    ties = BASE.group_size / tokens
    assert (1 / tokens <= kept <= ties) if quantile == 0 else kept == pytest.approx(quantile, abs=ties)
    assert top.history[0]["policy_loss"] != whole.history[0]["policy_loss"]


def test_entropy_masking_needs_a_policy_that_reports_entropies(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class NoEntropy(ToyPolicy):
        logprobs_and_entropies = None  # a policy that scores tokens but has no entropies

    with pytest.raises(ValueError, match="has no logprobs_and_entropies"):
        _trainer(tmp_path, "none", NoEntropy(), **{"objective.top_entropy_quantile": 0.2})
