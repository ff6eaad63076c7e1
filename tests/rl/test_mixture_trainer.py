"""The GRPO and SFT loops on a mixture of two toy envs: per-env step and validation figures, batches drawn by
weight, SFT targets dispatched to each sub-env, and an exact resume."""

import dataclasses

import jax
import numpy as np
import pytest
from toy import ToyEnv, ToyPolicy

from vlmgym.envs import registry
from vlmgym.envs.base import PART_KEY
from vlmgym.envs.mixture import MixtureEnv, MixtureParams
from vlmgym.params import SFTParams, TrainParams, with_values
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.loop import TIMING_METRICS
from vlmgym.rl.sft_trainer import SFTTrainer

POLICY = ToyPolicy(num_prompts=16)
BASE = with_values(TrainParams(steps=6, batch_prompts=4, group_size=4, samples_every=5, num_samples=2), {
    "optimizer.lr": 0.02, "optimizer.warmup_steps": 0, "checkpointing.every": 2, "validation.every": 3,
    "validation.batch_size": 4, "validation.select": "last"})


class ToyA(ToyEnv):
    name = "toy_a"


class ToyB(ToyEnv):
    """Another toy task: prompts 8.. (so the policy tells them from toy_a's), each with another target than
    toy_a's for the same prompt (so toy_a's ideal answer for a toy_b sample is wrong)."""

    name = "toy_b"

    def __init__(self, num_prompts: int = 8):
        super().__init__(num_prompts)
        self.samples = [dataclasses.replace(s, key=f"b{s.key}", meta={"prompt": s.meta["prompt"] + 8})
                        for s in self.samples]

    def target(self, prompt: int) -> list[int]:
        return super().target(prompt + 3)


@pytest.fixture(autouse=True)
def toy_envs(scoped_envs):
    registry.register("toy_a", ToyA)
    registry.register("toy_b", ToyB)


def _mixture(weights=(3.0, 1.0), weighted=True, prompts=8):
    params = MixtureParams(envs={"toy_a": weights[0], "toy_b": weights[1]})
    return MixtureEnv({"toy_a": ToyA(num_prompts=prompts), "toy_b": ToyB(num_prompts=prompts)}, params=params,
                      weighted=weighted)


def _run(folder, stop_after=None, logged=None):
    callback = None if logged is None else (lambda step, metrics: logged.append(metrics))
    trainer = GRPOTrainer(POLICY, _mixture(), POLICY.init(jax.random.key(0)), BASE, folder, progress_bar=False,
                          val_env=_mixture(weighted=False, prompts=3), metrics_callback=callback)
    trainer.run(stop_after=stop_after)
    return trainer


def test_grpo_logs_each_envs_figures_and_draws_by_weight(tmp_path):
    logged = []
    trainer = _run(tmp_path / "full", logged=logged)
    history = trainer.history
    shares = [m.get("env/toy_a/share", 0.0) for m in history]
    assert np.mean(shares) == pytest.approx(0.75, abs=0.2)
    for m in history:
        assert m.get("env/toy_a/share", 0.0) + m.get("env/toy_b/share", 0.0) == pytest.approx(1.0)
        present = [name for name in ("toy_a", "toy_b") if f"env/{name}/share" in m]
        # the pooled mean is the share-weighted mean of the per-env ones
        pooled = sum(m[f"env/{n}/share"] * m[f"env/{n}/reward_mean"] for n in present)
        assert pooled == pytest.approx(m["reward_mean"])
        for name in present:
            assert {f"env/{name}/final_reward_mean", f"env/{name}/reward/match", f"env/{name}/reward/stops"} <= set(m)
        assert "reward_mean" in m and "reward/match" in m  # the pooled figures keep their names
    validated = [m for m in history if "val/reward_greedy" in m]
    assert validated and all("env/toy_a/val/reward_greedy" in m and "env/toy_b/val/reward_greedy" in m
                             and "env/toy_b/val/reward_sampled" in m for m in validated)
    for m in validated:  # 3 val prompts of each env: the pooled figure is the mean of the two
        pooled = (m["env/toy_a/val/reward_greedy"] + m["env/toy_b/val/reward_greedy"]) / 2
        assert pooled == pytest.approx(m["val/reward_greedy"])
    # what MLflow gets (the stage's metrics callback): the step-0 validation, then each step's figures
    assert "env/toy_a/val/reward_greedy" in logged[0]
    assert sum("env/toy_a/reward_mean" in m or "env/toy_b/reward_mean" in m for m in logged) == BASE.steps


def test_a_killed_mixture_run_resumes_exactly(tmp_path):
    full = _run(tmp_path / "full")
    _run(tmp_path / "resumed", stop_after=5)
    second = _run(tmp_path / "resumed")
    start = second.resumed_from
    assert 0 < start < 5

    def deterministic(history):
        return [{k: v for k, v in m.items() if k not in TIMING_METRICS} for m in history]

    assert deterministic(second.history) == deterministic(full.history)[start:]


def test_sft_teaches_each_sub_envs_own_target(tmp_path):
    config = with_values(SFTParams(steps=60, batch_size=8), {
        "optimizer.lr": 0.05, "optimizer.warmup_steps": 0, "checkpointing.every": 100, "validation.every": 0})
    mix = _mixture(weights=(1.0, 1.0))
    trainer = SFTTrainer(POLICY, mix, POLICY.init(jax.random.key(0)), config, tmp_path / "sft", progress_bar=False)
    params = trainer.run()
    test = _mixture(weighted=False)
    resets = [test.reset(i) for i in range(len(test))]
    greedy = POLICY.greedy(params, [obs for _, obs in resets])
    rewards = {"toy_a": [], "toy_b": []}
    for (state, _), tokens, mask in zip(resets, greedy.tokens, greedy.mask):
        _, _, reward, _, info = test.step(state, [int(t) for t, m in zip(tokens, mask) if m > 0])
        rewards[info[PART_KEY]].append(reward)
    # both tasks learned: each sample's target comes from its own env (toy_b scoring toy_a's targets fails)
    assert np.mean(rewards["toy_a"]) > 0.9 and np.mean(rewards["toy_b"]) > 0.9, rewards
