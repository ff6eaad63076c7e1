"""nlvr2 SFT with a held-out curve: does the policy's answer come to depend on the pair, and is it right?

Runs the sft stage's trainer (SFTTrainer, sft section of params.yaml with the overrides below) and every
--eval-every steps scores --eval-n test pairs. Plain mode (the env's one-word target): the log-prob of "True"
minus that of "False" per pair gives the accuracy, the share answered True and the spread (standard deviation)
of the difference over pairs; a spread near 0 means the answer no longer depends on the images or statement.
--caption: the target first describes both scenes ("left: large red circle, ...; right: ... . True"), a
first-order visual task, and the greedy answers give the verdict's accuracy and the share of exact captions.
Run where the nlvr2 shards and base model exist, with env.nlvr2.trace: false (see probe.py):

    python scripts/nlvr2/sft_curve.py --steps 400 --lr 3e-4 [--text-first] [--caption] [--max-pixels 49152]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time

import jax
import numpy as np

from vlmgym import envs
from vlmgym.envs.nlvr2.data import generate_split
from vlmgym.envs.nlvr2.env import NLVR2Env, parse_answer
from vlmgym.params import load_section, with_values
from vlmgym.rl.sft_trainer import SFTTrainer
from vlmgym.rl.stage_setup import load_policy
from vlmgym.rollout import RolloutEngine, SamplingSettings


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-n", type=int, default=256, help="test pairs scored at each evaluation")
    parser.add_argument("--text-first", action="store_true", help="statement before the images in the prompt")
    parser.add_argument("--caption", action="store_true", help="describe both scenes before the verdict")
    parser.add_argument("--max-target", type=int, default=96, help="answer token budget with --caption")
    parser.add_argument("--max-pixels", type=int, default=0, help="image budget override (0: the model's own)")
    parser.add_argument("--model", default="models/jax/base")
    return parser.parse_args()


def _statement_first(env: envs.Env) -> None:
    plain = env.observation

    def observation(sample):
        obs = plain(sample)
        content = obs["messages"][0]["content"]
        obs["messages"][0]["content"] = [content[-1], *content[:-1]]
        return obs

    env.observation = observation


def _describe(scene) -> str:
    return ", ".join(f"{o.size} {o.colour} {o.shape}" for o in sorted(scene, key=lambda o: o.x))


def main() -> None:
    args = _arguments()
    data = load_section("data")
    # the scenes the shards were rendered from: the configured generator (data.nlvr2), not generate_split's defaults
    settings = NLVR2Env.data_settings(data)
    knobs = settings.knobs()
    sft = with_values(load_section("sft"), {
        "steps": args.steps, "optimizer.lr": args.lr, "batch_size": args.batch, "validation.every": 0,
        "optimizer.warmup_steps": args.warmup, "checkpointing.every": 10**9, "max_target_tokens": args.max_target})
    policy, params = load_policy(args.model, load_section("model"), args.max_target if args.caption else 8)
    if args.max_pixels:
        policy.processor.settings = dataclasses.replace(policy.processor.settings, max_pixels=args.max_pixels)
    env_params = load_section("env")
    if getattr(env_params.settings(), "trace", False):  # it measures the one-word setup (or its own --caption)
        raise SystemExit("sft_curve.py runs the one-word target: set env.nlvr2.trace: false in params.yaml")
    train = envs.from_params(env_params, shards_dir="data/shards", split="train")
    test = envs.from_params(env_params, shards_dir="data/shards", split="test", limit=args.eval_n)
    if args.text_first:
        _statement_first(train)
        _statement_first(test)
    pairs = {p.id: p for split, count in (("train", settings.train_pairs or data.train_images),
                                          ("test", data.test_images))
             for p in generate_split(data.seed, split, count, data.image_width, data.image_height, **knobs)}

    def caption_target(meta: dict) -> str:
        pair = pairs[meta["id"]]
        return f"left: {_describe(pair.left)}; right: {_describe(pair.right)}. {'True' if meta['label'] else 'False'}"

    if args.caption:
        train.ideal_answer = caption_target
    true_ids, true_mask = policy.encode_targets(["True"])
    false_ids, false_mask = policy.encode_targets(["False"])
    logprobs = jax.jit(policy.logprobs)
    processor = policy.processor
    engine = RolloutEngine(policy.cfg, processor, SamplingSettings(
        max_new_tokens=args.max_target, greedy=True, eos_ids=tuple(processor.eos_token_ids),
        pad_id=int(processor.pad_token_id)))

    def evaluate(current) -> dict:
        hits, said_true, spread, exact = [], [], [], []
        for start in range(0, len(test), 16):
            resets = [test.reset(i) for i in range(start, min(start + 16, len(test)))]
            observations, truths = [obs for _, obs in resets], [state.truth for state, _ in resets]
            if args.caption:
                texts = engine.generate(current, observations, 1, jax.random.key(0)).texts
                for (state, _), text in zip(resets, texts):
                    verdict = parse_answer(text.rsplit(".", 1)[-1])
                    hits.append(verdict is not None and verdict == state.truth)
                    said_true.append(verdict is True)
                    exact.append(text.rsplit(".", 1)[0] == caption_target(state.meta).rsplit(".", 1)[0])
                continue
            n = len(observations)
            score_true = np.asarray(logprobs(current, policy.build_batch(
                observations, np.repeat(true_ids, n, 0), np.repeat(true_mask, n, 0)))).sum(1)
            score_false = np.asarray(logprobs(current, policy.build_batch(
                observations, np.repeat(false_ids, n, 0), np.repeat(false_mask, n, 0)))).sum(1)
            difference = score_true - score_false
            spread += list(difference)
            said_true += list(difference > 0)
            hits += [(d > 0) == truth for d, truth in zip(difference, truths)]
        out = {"accuracy": float(np.mean(hits)), "says_true": float(np.mean(said_true))}
        out.update({"caption_exact": float(np.mean(exact))} if args.caption else {"spread": float(np.std(spread))})
        return out

    with tempfile.TemporaryDirectory() as checkpoints:
        trainer = SFTTrainer(policy, train, params, sft, checkpoints, progress_bar=False)
        started, losses = time.time(), []
        print(json.dumps({"step": 0, **evaluate(trainer.params)}), flush=True)
        for step in range(args.steps):
            losses.append(trainer.step(step)["loss"])
            if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
                print(json.dumps({"step": step + 1, "loss": float(np.mean(losses[-args.eval_every:])),
                                  **evaluate(trainer.params), "seconds": round(time.time() - started)}), flush=True)


if __name__ == "__main__":
    main()
