"""GRPO logs, per step, the most frequent sampled answer's share (the evaluate stage's collapse check)."""

from __future__ import annotations

import jax
import pytest
from toy import ToyEnv, ToyPolicy

from vlmgym.eval.metrics import answer_spread
from vlmgym.params import TrainParams, with_values
from vlmgym.rl.grpo_trainer import GRPOTrainer


class RecordingPolicy(ToyPolicy):
    """The toy policy, keeping every batch of sampled texts."""

    def sample(self, params, observations, group_size, rng):
        samples = super().sample(params, observations, group_size, rng)
        self.sampled.append(list(samples.texts))
        return samples


@pytest.mark.parametrize("filter_groups", [False, True])
def test_answer_top_share_is_over_every_sampled_completion_of_the_step(tmp_path, filter_groups):
    policy = RecordingPolicy()
    object.__setattr__(policy, "sampled", [])  # ToyPolicy is a frozen dataclass (hashable for jit)
    config = with_values(TrainParams(steps=3, batch_prompts=4, group_size=8, samples_every=5, num_samples=2,
                                     filter_groups=filter_groups, max_sample_rounds=2), {
        "optimizer.lr": 0.02, "optimizer.warmup_steps": 0, "checkpointing.every": 3, "validation.every": 0,
        "validation.select": "last"})
    trainer = GRPOTrainer(policy, ToyEnv(), policy.init(jax.random.key(0)), config, tmp_path / "ckpt",
                          progress_bar=False)
    trainer.run()
    rounds = [int(m["sample_rounds"]) for m in trainer.history]
    batches = iter(policy.sampled)
    for metrics, count in zip(trainer.history, rounds):
        texts = [t for _ in range(count) for t in next(batches)]
        assert metrics["answer_top_share"] == pytest.approx(answer_spread(texts)["top_share"])
        assert 1 / len(texts) <= metrics["answer_top_share"] <= 1
