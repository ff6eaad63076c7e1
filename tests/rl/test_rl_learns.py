"""GRPO from the base policy (no SFT) learns docs/writing-an-env.md's colour plug-in: the RL loop learns, not just runs.

The policy, data and trainer come as the pipeline makes them: a tiny random Qwen3-VL from the base_model and
convert code, the colour env's synthetic data through the shard code, `stage_policy` / `stage_trainer` as the
train stage calls them. Greedy accuracy is measured on the shards' test split, which training never sees.

What makes the task learnable from a random start, without touching the env's reward (0.9 right colour + 0.1 a
colour word): a 300-token tokenizer in which each colour word is one token, and `max_new_tokens: 1`, so an answer
is one token and a random policy says some colour word ~4/293 of the time; 16 prompts x 16 samples per step then
find a few rewarded answers from the first step. lr 1e-3 held constant: at 3e-3 and above (or with the cosine
decay) the policy often goes deterministic on a wrong mapping first, after which its groups have no spread and
nothing more is learned.

Measured (the seeds below, 2 CPU cores): held-out greedy accuracy 0.00 at the start (the base model's greedy
token is no colour word), 0.47 after 50 steps, 1.00 after 120; with the reward negated 0.00, 0.00, 0.00. Each
run takes ~45 s on a quiet machine, compilation (~30 s of it) included; the module ~100 s.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from vlmgym.data.shard_writer import shard_raw
from vlmgym.models.checkpoint import convert_hf_to_jax
from vlmgym.models.qwen3_vl.base_model import build_base_model
from vlmgym.params import DataParams, EnvParams, ModelParams, ShardParams, TrainParams, with_values
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.loop import score
from vlmgym.rl.stage_setup import stage_policy, stage_trainer

pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
from colour_env import COLOURS, ColourEnv  # noqa: E402

STEPS, MIDDLE = 120, 50
ENV = EnvParams(name="colour_env:ColourEnv")
TRAIN = with_values(TrainParams(steps=STEPS, batch_prompts=16, group_size=16, max_new_tokens=1, samples_every=STEPS,
                                seed=0), {
    "optimizer.lr": 1e-3, "optimizer.warmup_steps": 0, "optimizer.end_lr_ratio": 1.0, "sampling.temperature": 1.0,
    "validation.every": 0, "validation.select": "last", "checkpointing.every": STEPS})


class ContraryColourEnv(ColourEnv):
    """The colour env with its reward negated: the negative control, which must drive accuracy down, not up."""

    name = "contrary_colour"

    def score(self, state, text):
        reward, info = super().score(state, text)
        return -reward, info


@pytest.fixture(scope="module")
def colour_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("colour_rl")
    model = ModelParams(hf_dir=str(root / "hf"), jax_dir=str(root / "jax"), tiny_hidden_size=64, tiny_num_layers=2,
                        tiny_vocab_size=300, seed=0)
    # The env's corpus names each colour once; BPE merges only pairs seen twice, so one more line of the colour
    # words makes each of them a single token.
    build_base_model(model, ColourEnv.corpus() + ["\n".join(COLOURS)])
    convert_hf_to_jax(model.hf_dir, model.jax_dir)
    data = DataParams(train_images=64, test_images=64, image_width=64, image_height=64, seed=0)
    ColourEnv.write_synthetic(data, root / "raw")
    shard_raw(root / "raw", root / "shards", ColourEnv.schema, ShardParams(val_samples=0, workers=1))
    return model, replace(TRAIN, init_dir=model.jax_dir, shards_dir=str(root / "shards")), root


def greedy_accuracy(policy, params, env) -> float:
    states, observations = zip(*(env.reset(i) for i in range(len(env))))
    samples = policy.greedy(params, list(observations))
    return float(np.mean([score(env, s, t, m)[1]["correct"] for s, t, m in zip(states, samples.tokens, samples.mask)]))


def accuracy_curve(colour_setup, name, contrary=False) -> dict[int, float]:
    """Held-out greedy accuracy before training, after MIDDLE steps and after STEPS."""
    model, section, root = colour_setup
    policy, params = stage_policy("train", section, model)
    tokenizer = policy.processor.tokenizer
    assert all(len(tokenizer.encode(colour)) == 1 for colour in COLOURS)
    test = ColourEnv(shards_dir=section.shards_dir, split="test", tokenizer=tokenizer)
    curve = {0: greedy_accuracy(policy, params, test)}  # before the trainer takes (donates) the params

    def at_middle(step, metrics):
        if step == MIDDLE:
            curve[MIDDLE] = greedy_accuracy(policy, trainer.params, test)

    if contrary:  # as stage_trainer builds it, over the negated env
        train = ContraryColourEnv(shards_dir=section.shards_dir, split="train", tokenizer=tokenizer)
        trainer = GRPOTrainer(policy, train, params, section, root / name, metrics_callback=at_middle,
                              progress_bar=False)
    else:
        trainer = stage_trainer("train", section, policy, params, ENV, root / name, metrics_callback=at_middle,
                                progress_bar=False)
    curve[STEPS] = greedy_accuracy(policy, trainer.run(), test)
    print(f"{name}: held-out greedy accuracy by step {curve}")
    return curve


def test_grpo_from_the_base_policy_learns_the_colours(colour_setup):
    curve = accuracy_curve(colour_setup, "grpo")
    assert curve[0] <= 0.25, curve  # chance or below: four colours, and the base model names none
    assert curve[STEPS] >= 0.9, curve


def test_negated_reward_stays_at_chance(colour_setup):
    # The same run with the reward's sign flipped: what rises above is the reward, not some artefact of training.
    curve = accuracy_curve(colour_setup, "contrary", contrary=True)
    assert max(curve.values()) <= 0.25, curve
