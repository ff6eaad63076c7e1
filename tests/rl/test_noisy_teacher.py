"""SFT from a noisy teacher (sft.label_noise): a fixed share of samples, chosen by key, is taught another sample's
different ideal answer; the trainer trains on those labels and counts them."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from toy import ToyEnv, ToyPolicy

from vlmgym.params import SFTParams, with_values
from vlmgym.rl.noisy_teacher import NoisyTeacher
from vlmgym.rl.sft_trainer import SFTTrainer


def test_a_fixed_share_of_samples_gets_another_samples_different_answer():
    env = ToyEnv(num_prompts=400)
    ideals = {env.sft_target(s.meta) for s in env.samples}
    taught = [NoisyTeacher(env, 0.3).target(env.reset(i)[0]) for i in range(len(env))]
    wrong = [i for i, (_, is_wrong) in enumerate(taught) if is_wrong]
    assert 0.25 < len(wrong) / len(env) < 0.35
    for i, (target, is_wrong) in enumerate(taught):
        ideal = env.sft_target(env.reset(i)[0].meta)
        assert (target != ideal) == is_wrong and target in ideals
    # the same labels from another teacher of the same share: the dataset is noisy, not the draw
    assert [NoisyTeacher(env, 0.3).target(env.reset(i)[0]) for i in range(len(env))] == taught
    # a larger share mislabels a superset
    more = {i for i in range(len(env)) if NoisyTeacher(env, 0.6).target(env.reset(i)[0])[1]}
    assert set(wrong) < more
    assert not any(NoisyTeacher(env, 0.0).target(env.reset(i)[0])[1] for i in range(len(env)))
    with pytest.raises(ValueError, match=r"sft.label_noise: expected a share in \[0, 1\)"):
        NoisyTeacher(env, 1.0)


def test_sft_trains_on_the_noisy_labels_and_counts_them(tmp_path):
    env = ToyEnv()
    wrong = sum(NoisyTeacher(env, 0.5).target(env.reset(i)[0])[1] for i in range(len(env)))
    assert 0 < wrong < len(env)
    config = with_values(SFTParams(steps=2, batch_size=8, label_noise=0.5), {
        "validation.every": 0, "optimizer.lr": 0.03, "optimizer.warmup_steps": 0, "checkpointing.every": 2})
    policy = ToyPolicy()
    trainer = SFTTrainer(policy, env, policy.init(jax.random.key(0)), config, tmp_path / "sft", progress_bar=False)
    trainer.run()
    # each step's batch is the 8 prompts once (one epoch): the mislabelled share is the teacher's exactly
    assert [m["targets_mislabelled"] for m in trainer.history] == [wrong / 8] * 2
    clean = SFTTrainer(policy, env, policy.init(jax.random.key(0)), with_values(config, {"label_noise": 0.0}),
                       tmp_path / "clean", progress_bar=False)
    clean.run()
    assert "targets_mislabelled" not in clean.history[0]
    assert not np.isclose(clean.history[0]["loss"], trainer.history[0]["loss"])
