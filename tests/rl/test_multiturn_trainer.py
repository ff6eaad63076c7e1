"""GRPO and online DPO on multi-turn episodes: every policy turn is a learner row scored on-policy, tool replies sit
only in prompts, each turn gets its episode's advantage (DPO: its episode's side of the pair), validation plays whole
episodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from turn_ends import ending_turns_early

from vlmgym.envs import multiturn
from vlmgym.envs.digits import DigitsEnv
from vlmgym.envs.digits.env import DigitsParams
from vlmgym.envs.tools import ToolCall, ToolOutcome, Zoom
from vlmgym.eval.rollouts import answer_split
from vlmgym.models.qwen3_vl import lora
from vlmgym.params import LoRAParams, SFTParams, TrainParams, with_values
from vlmgym.rl.dpo_trainer import DPOTrainer
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.policy import Qwen3VLPolicy
from vlmgym.rl.sft_trainer import SFTTrainer
from vlmgym.rollout.sampling import SamplingSettings
from vlmgym.runtime import killpoint

pytestmark = pytest.mark.slow

KILL_WORKER = Path(__file__).with_name("multiturn_kill_worker.py")
NEW_TOKENS = 10
SAMPLES = DigitsEnv.generate(4, seed=0)


@pytest.fixture(scope="module")
def talkative(tiny_vlm):
    """The tiny model with <|im_end|>'s output row along its mean final hidden state: turns often end early, so
    episodes go on (a random model's next token is near uniform over the vocabulary)."""
    policy = _policy(tiny_vlm)
    observations = [DigitsEnv(samples=SAMPLES).reset(0)[1]]
    probe = policy.engine.generate(tiny_vlm.params, observations, 8, jax.random.key(1))
    im_end = tiny_vlm.processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    return ending_turns_early(tiny_vlm.params, tiny_vlm.cfg, probe, im_end, 6.0)


def _policy(tiny_vlm, max_new_tokens=NEW_TOKENS):
    settings = SamplingSettings(max_new_tokens=max_new_tokens, eos_ids=tuple(tiny_vlm.processor.eos_token_ids),
                                pad_id=int(tiny_vlm.processor.pad_token_id))
    return Qwen3VLPolicy(tiny_vlm.cfg, tiny_vlm.processor, settings)


def zoom_top_left(tools, text, image):
    """multiturn.run_tool_call for a model that writes no well-formed call: every turn that can go on zooms into
    the top-left quarter."""
    arguments = {"x1": 0, "y1": 0, "x2": 500, "y2": 500}
    return ToolOutcome(call=ToolCall("zoom", arguments), result=Zoom().run(arguments, image), error=None)


@pytest.fixture
def always_zoom(monkeypatch):
    """Episodes take their later turns with real crops (zoom_top_left)."""
    monkeypatch.setattr(multiturn, "run_tool_call", zoom_top_left)


@pytest.fixture
def spread_rewards(monkeypatch):
    """Digits answers scored by their length (a random model's digits all score 0): groups with a best and a worst."""
    monkeypatch.setattr(DigitsEnv, "score", lambda self, state, text: ((len(text) % 5) / 4, {"format_ok": True}))


def _env(tiny_vlm, max_turns=3):
    return DigitsEnv(samples=SAMPLES, params=DigitsParams(tools=("zoom",), max_turns=max_turns),
                     tokenizer=tiny_vlm.processor.tokenizer)


def _config(**values):
    return with_values(TrainParams(steps=1, batch_prompts=2, group_size=3, max_new_tokens=NEW_TOKENS), {
        "optimizer.lr": 1e-3, "validation.every": 0, "validation.select": "last", "optimizer.warmup_steps": 0,
        "checkpointing.every": 1, **values})


def test_every_turn_is_a_learner_row_scored_on_policy_with_tool_replies_in_prompts_only(tiny_vlm, talkative,
                                                                                        always_zoom, tmp_path):
    policy = _policy(tiny_vlm)
    built = []
    original = policy.build_batch
    policy.build_batch = lambda obs, tokens, mask: built.append((obs, tokens, mask)) or original(obs, tokens, mask)
    trainer = GRPOTrainer(policy, _env(tiny_vlm), jax.tree.map(jax.numpy.copy, talkative), _config(),
                          tmp_path / "grpo", progress_bar=False)
    trainer.run()
    figures = trainer.history[0]
    assert figures["episode_turns"] > 1.0 and figures["tool_calls_per_episode"] > 0
    assert figures["tool_call_error_share"] == 0.0
    # The later turns' rows are scored against the context they were sampled in: on-policy, the ratio is 1.
    assert figures["logprob_mismatch_max"] < 1e-4
    later = [(obs, tokens, mask) for obs, tokens, mask in built if len(obs) == len(tokens)]
    assert later, "no later-turn rows were built"
    tokenizer = tiny_vlm.processor.tokenizer
    response = tokenizer.convert_tokens_to_ids("<tool_response>")  # one token, as in Qwen3's tokenizer
    for observations, tokens, mask in later:
        for obs, row, active in zip(observations, tokens, mask):
            assert obs["messages"][-1]["role"] == "tool" and len(obs["images"]) >= 2
            assert response not in row[active > 0]
            prompt = policy.engine.prepare([obs])["input_ids"][0]
            assert (prompt == response).sum() == len(obs["images"]) - 1
    # Policy tokens of every turn carry the loss: the rows' active tokens are the episodes' sampled tokens.
    active_rows = sum(int((mask.sum(axis=1) > 0).sum()) for _, _, mask in built)
    assert active_rows == round(figures["episode_turns"] * 2 * 3)


def test_validation_plays_whole_episodes(tiny_vlm, talkative, always_zoom, tmp_path):
    config = _config(**{"validation.every": 1, "validation.batch_size": 2})
    env = _env(tiny_vlm, max_turns=2)
    trainer = GRPOTrainer(_policy(tiny_vlm), env, jax.tree.map(jax.numpy.copy, talkative), config,
                          tmp_path / "grpo", progress_bar=False, val_env=_env(tiny_vlm, max_turns=2))
    figures = trainer.validator.evaluate(talkative)
    assert 0.0 <= figures["val/reward_greedy"] <= 1.0 and "val/reward_sampled" in figures


def test_dpo_pairs_whole_episodes_and_trains_every_turn_of_both(tiny_vlm, talkative, always_zoom, spread_rewards,
                                                                tmp_path):
    policy = _policy(tiny_vlm)
    built = []
    original = policy.build_batch
    policy.build_batch = lambda obs, tokens, mask: built.append((obs, tokens, mask)) or original(obs, tokens, mask)
    trainer = DPOTrainer(policy, _env(tiny_vlm), jax.tree.map(jax.numpy.copy, talkative), _config(algorithm="dpo"),
                         tmp_path / "dpo", progress_bar=False)
    trainer.run()
    figures = trainer.history[0]
    assert figures["episode_turns"] > 1.0 and figures["dpo_pairs"] >= 1
    # every turn of both episodes scored on-policy; at the start the policy is its reference: log 2, no margin
    assert figures["logprob_mismatch_max"] < 1e-4
    assert figures["loss"] == pytest.approx(np.log(2.0), rel=1e-4) and abs(figures["dpo_margin"]) < 1e-4
    later = [mask for obs, _, mask in built if len(obs) == len(mask)]
    later_rows = sum(int((mask.sum(axis=1) > 0).sum()) for mask in later)
    assert 0 < later_rows <= 2 * figures["dpo_pairs"] * 2  # only the pairs' episodes, two later turns at most
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(trainer.params), jax.tree.leaves(talkative))]
    assert any(moved)


def test_dpo_over_one_turn_episodes_has_the_one_turn_gradient(tiny_vlm, spread_rewards, monkeypatch, tmp_path):
    """The episode path's two passes (row coefficients, then weighted log-prob gradients) give the gradient of the
    one-pass DPO loss when every episode is one turn."""
    from vlmgym.rl import dpo_trainer

    policy = _policy(tiny_vlm)
    grads = []
    original = dpo_trainer.apply_update
    monkeypatch.setattr(dpo_trainer, "apply_update",
                        lambda params, state, g, **kw: grads.append(jax.device_get(g)) or original(params, state, g,
                                                                                                 **kw))
    env = DigitsEnv(samples=SAMPLES, tokenizer=tiny_vlm.processor.tokenizer)
    config = _config(algorithm="dpo", group_size=4)
    DPOTrainer(policy, env, jax.tree.map(jax.numpy.copy, tiny_vlm.params), config, tmp_path / "one",
               progress_bar=False).run()
    monkeypatch.setattr(dpo_trainer, "max_turns", lambda env: 2)
    episodes = DPOTrainer(policy, env, jax.tree.map(jax.numpy.copy, tiny_vlm.params), config, tmp_path / "episodes",
                          progress_bar=False)
    episodes.run()
    assert episodes.history[0]["dpo_pairs"] >= 1
    one, two = (jax.tree.leaves(g) for g in grads)
    scale = max(float(np.abs(leaf).max()) for leaf in one)
    assert scale > 0
    for a, b in zip(one, two):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * scale)


def test_rollout_records_hold_the_whole_trajectory(tiny_vlm, talkative, always_zoom):
    env = _env(tiny_vlm)
    engine = _policy(tiny_vlm)._greedy_engine
    records, timing = answer_split(engine, talkative, env, policy="grpo", batch_size=4, show_progress=False)
    assert [r["id"] for r in records] == [s.key for s in SAMPLES]
    assert any(r["episode_turns"] > 1 for r in records)
    for record in records:
        assert len(record["turns"]) == len(record["turn_tokens"]) == record["episode_turns"]
        assert record["answer"] == record["turns"][-1] and record["tokens"] == record["turn_tokens"][0]
        assert len(record["tool_calls"]) == record["episode_turns"] - 1
        assert all(call["box"] == [0.0, 0.0, 500.0, 500.0] for call in record["tool_calls"])
    assert timing.generated_tokens == sum(len(t) for r in records for t in r["turn_tokens"])
    # The text-only baseline blanks what the tools see too: every crop of a grey image is grey.
    seen = []
    original = multiturn.run_tool_call

    def spy(tools, text, image):
        seen.append(np.asarray(image))
        return original(tools, text, image)

    multiturn.run_tool_call = spy
    try:
        answer_split(engine, talkative, env, policy="grpo", batch_size=4, show_progress=False, blank_images=True)
    finally:
        multiturn.run_tool_call = original
    assert seen and all((image == 128).all() for image in seen)


def test_sft_trains_each_turn_of_the_ideal_episode(tiny_vlm, tmp_path):
    policy = _policy(tiny_vlm, max_new_tokens=128)  # the zoom call spelled out by a tokenizer that never saw it
    built = []
    original = policy.build_batch
    policy.build_batch = lambda obs, tokens, mask: built.append((obs, tokens, mask)) or original(obs, tokens, mask)
    config = with_values(SFTParams(steps=1, batch_size=2, max_target_tokens=128), {
        "validation.every": 0, "validation.select": "last", "optimizer.warmup_steps": 0, "checkpointing.every": 1})
    trainer = SFTTrainer(policy, _env(tiny_vlm, max_turns=2), jax.tree.map(jax.numpy.copy, tiny_vlm.params),
                         config, tmp_path / "sft", progress_bar=False)
    trainer.run()
    observations = [obs for batch, _, _ in built for obs in batch]
    masks = np.concatenate([mask for _, _, mask in built])
    assert len(observations) == 4 and (masks.sum(axis=1) > 0).all()  # two samples, a zoom and an answer each
    calls = [obs for obs in observations if obs["messages"][-1]["role"] == "user"]
    answers = [obs for obs in observations if obs["messages"][-1]["role"] == "tool"]
    assert len(calls) == len(answers) == 2 and all(len(obs["images"]) == 2 for obs in answers)
    assert np.isfinite(trainer.history[0]["loss"])


def resume_trainer(tiny_vlm, params, folder, policy=None):
    """The resume test's run: two steps of two-turn episodes in groups of two (few shapes to compile)."""
    return GRPOTrainer(policy or _policy(tiny_vlm), _env(tiny_vlm, max_turns=2), jax.tree.map(jax.numpy.copy, params),
                       _config(steps=2, group_size=2), folder, progress_bar=False)


def test_multi_turn_training_resumes_exactly_after_a_kill(tiny_vlm, talkative, always_zoom, tmp_path):
    policy = _policy(tiny_vlm)  # one policy: a static argument of the jitted update, so the runs share its compiles
    whole = resume_trainer(tiny_vlm, talkative, tmp_path / "whole", policy)
    whole.run()
    # The same run in a process of its own, SIGKILLed inside the save of step 2 (after step 1's checkpoint)
    leaves = jax.tree.leaves(talkative)
    np.savez(tmp_path / "talkative.npz", *[np.asarray(leaf, np.float32) for leaf in leaves])
    split = tmp_path / "split"
    env = {**os.environ, killpoint.ENV: str(split / "2"), "JAX_PLATFORMS": "cpu"}
    child = subprocess.run([sys.executable, str(KILL_WORKER), tiny_vlm.folder, str(tmp_path / "talkative.npz"),
                            str(split)], cwd=KILL_WORKER.parent, env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert "inside the write of" in child.stderr
    resumed = resume_trainer(tiny_vlm, talkative, split, policy)
    resumed.run()
    assert resumed.resumed_from == 1 and whole.history[-1]["episode_turns"] > 1.0
    bits = [np.asarray(x).tobytes() for x in jax.tree.leaves(resumed.params)]
    assert bits == [np.asarray(x).tobytes() for x in jax.tree.leaves(whole.params)]
    for name in ("loss", "reward_mean", "episode_turns", "grad_norm"):
        assert resumed.history[-1][name] == whole.history[-1][name], name


def test_lora_and_the_kl_term_train_episodes_too(tiny_vlm, talkative, always_zoom, tmp_path):
    # the reference's log-probs of every turn (the KL term's) come from the base inside the trained tree
    config = _config(**{"objective.beta": 0.1}, lora=LoRAParams(rank=4, alpha=8.0))
    params = lora.init_adapters(jax.tree.map(jax.numpy.copy, talkative), tiny_vlm.cfg,
                                lora.LoRAConfig.from_section(config.lora))
    trainer = GRPOTrainer(_policy(tiny_vlm), _env(tiny_vlm), params, config, tmp_path / "lora", progress_bar=False)
    trainer.run()
    figures = trainer.history[0]
    assert figures["episode_turns"] > 1.0 and figures["logprob_mismatch_max"] < 1e-4
    assert figures["kl_to_reference"] == pytest.approx(0.0, abs=1e-6)  # B starts at 0: step 0 is the base
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(lora.strip(trainer.params)),
                                                       jax.tree.leaves(talkative))]
    assert not any(moved) and lora.has_adapters(trainer.params)
