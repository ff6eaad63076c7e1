"""Perception or binding? nlvr2 SFT on pairs whose statements come from a handful, with a held-out curve.

The pairs are drawn here (nlvr2's scene sampler and renderer, labels balanced) with one statement family:
- `fixed`: "There is a red shape in the left image." for every pair: the label is a visual fact of the left
  image alone (no statement x image interaction to learn);
- `sides`: the same about the left or the right image (2 statements);
- `colours`: the left image and any of the four colours (4 statements).
`--then KIND --switch N` changes the family after N steps (a curriculum: first the fixed fact, then statements
that vary); the held-out pairs are always of the last family. Every --eval-every steps it prints the accuracy of
log p(True) > log p(False), the share answered True and the spread (standard deviation) of that difference over
the held-out pairs: a spread near 0 means the answer no longer depends on the pair. `--think` makes the target
name the colours in the statement's image first, then the verdict ("blue red. True"); it then scores greedy answers:
the verdict's accuracy and the share of exact colour lists (`seen_exact`). Run where a model folder
with a tokenizer trained on nlvr2's texts exists (after `dvc repro convert` with env.name: nlvr2):

    python scripts/nlvr2/few_statements.py --statements fixed --object-scale 3 --max-objects 2
    python scripts/nlvr2/few_statements.py --statements fixed --then colours --switch 150 --object-scale 3 \
        --max-objects 2 --steps 600
    python scripts/nlvr2/few_statements.py --statements colours --object-scale 3 --max-objects 2 --steps 300 --think
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from dataclasses import dataclass

import jax
import numpy as np

from vlmgym.envs.nlvr2.data import COLOURS, render_scene, sample_scene
from vlmgym.envs.nlvr2.env import NLVR2Env, parse_answer
from vlmgym.params import load_section, with_values
from vlmgym.rl.loop import DataOrder
from vlmgym.rl.prefetch import ResetPrefetcher
from vlmgym.rl.sft_trainer import SFTTrainer
from vlmgym.rl.stage_setup import load_policy
from vlmgym.rollout import RolloutEngine, SamplingSettings

KINDS = ("fixed", "sides", "colours")
WIDTH, HEIGHT = 256, 192


@dataclass
class Pair:
    key: str
    images: list
    meta: dict


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", choices=KINDS, default="fixed")
    parser.add_argument("--then", choices=KINDS, help="the family after --switch steps")
    parser.add_argument("--switch", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--pairs", type=int, default=4000, help="train pairs per family")
    parser.add_argument("--object-scale", type=float, default=1.5)
    parser.add_argument("--max-objects", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--model", default="models/jax/base")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--think", action="store_true",
                        help="the target first names the colours in the statement's image, then the verdict")
    return parser.parse_args()


def _seen_then_verdict(meta: dict) -> str:
    """--think's target: the colours in the image the statement is about, then the verdict."""
    return f"{meta['seen']}. {'True' if meta['label'] else 'False'}"


def pairs(kind: str, split: str, count: int, scale: float, max_objects: int) -> list[Pair]:
    """`count` pairs of a statement family, True and False alternating."""
    rng, out = random.Random(f"{split}-{kind}"), []
    while len(out) < count:
        side = rng.randrange(2) if kind == "sides" else 0
        colour = rng.choice(sorted(COLOURS)) if kind == "colours" else "red"
        scenes = [sample_scene(rng, WIDTH, HEIGHT, None, max_objects, scale) for _ in range(2)]
        label = any(o.colour == colour for o in scenes[side])
        if label != (len(out) % 2 == 0):
            continue
        key = f"{split}-{len(out)}"
        seen = " ".join(sorted({o.colour for o in scenes[side]}))
        out.append(Pair(key, [render_scene(s, WIDTH, HEIGHT, rng) for s in scenes],
                        {"id": key, "sentence": f"There is a {colour} shape in the {('left', 'right')[side]} image.",
                         "label": label, "seen": seen}))
    return out


def main() -> None:
    args = _arguments()
    started = time.time()
    budget = 16 if args.think else 8
    sft = with_values(load_section("sft", args.params), {
        "steps": args.steps, "optimizer.lr": args.lr, "batch_size": 16, "validation.every": 0,
        "optimizer.warmup_steps": 20, "checkpointing.every": 10**9, "max_target_tokens": budget})
    policy, params = load_policy(args.model, load_section("model", args.params), budget)
    tokenizer = policy.processor.tokenizer
    families = [args.statements] + ([args.then] if args.then else [])
    train = {kind: NLVR2Env(pairs(kind, "train", args.pairs, args.object_scale, args.max_objects), tokenizer=tokenizer)
             for kind in families}
    if args.think:
        for env in train.values():
            env.ideal_answer = _seen_then_verdict
    test = NLVR2Env(pairs(families[-1], "test", 256, args.object_scale, args.max_objects), tokenizer=tokenizer)
    true_ids, true_mask = policy.encode_targets(["True"])
    false_ids, false_mask = policy.encode_targets(["False"])
    logprobs = jax.jit(policy.logprobs)

    engine = RolloutEngine(policy.cfg, policy.processor, SamplingSettings(
        max_new_tokens=budget, greedy=True, eos_ids=tuple(policy.processor.eos_token_ids),
        pad_id=int(policy.processor.pad_token_id)))

    def evaluate_think(current) -> dict:
        hits, said_true, seen_right = [], [], []
        for start in range(0, len(test), 32):
            resets = [test.reset(i) for i in range(start, min(start + 32, len(test)))]
            texts = engine.generate(current, [obs for _, obs in resets], 1, jax.random.key(0)).texts
            for (state, _), text in zip(resets, texts):
                seen, _, verdict = text.rpartition(".")
                verdict = parse_answer(verdict)
                hits.append(verdict == state.truth)
                said_true.append(verdict is True)
                seen_right.append(seen.strip() == state.meta["seen"])
        return {"accuracy": float(np.mean(hits)), "says_true": float(np.mean(said_true)),
                "seen_exact": float(np.mean(seen_right)), "example": texts[0]}

    def evaluate(current) -> dict:
        if args.think:
            return evaluate_think(current)
        differences, truths = [], []
        for start in range(0, len(test), 32):
            resets = [test.reset(i) for i in range(start, min(start + 32, len(test)))]
            observations, n = [obs for _, obs in resets], len(resets)
            score = [np.asarray(logprobs(current, policy.build_batch(observations, np.repeat(ids, n, 0),
                                                                      np.repeat(mask, n, 0)))).sum(1)
                     for ids, mask in ((true_ids, true_mask), (false_ids, false_mask))]
            differences += list(score[0] - score[1])
            truths += [state.truth for state, _ in resets]
        differences = np.asarray(differences)
        return {"accuracy": float(np.mean((differences > 0) == np.asarray(truths))),
                "says_true": float(np.mean(differences > 0)), "spread": float(np.std(differences))}

    with tempfile.TemporaryDirectory() as checkpoints:
        trainer = SFTTrainer(policy, train[families[0]], params, sft, checkpoints, progress_bar=False)
        print(json.dumps({"step": 0, "statements": families[0], **evaluate(trainer.params)}), flush=True)
        losses = []
        for step in range(args.steps):
            if args.then and step == args.switch:  # the curriculum's next family, in a fresh order
                env = train[args.then]
                trainer.env, trainer.data, trainer.prefetch = env, DataOrder(len(env), 0), ResetPrefetcher(env)
            losses.append(trainer.step(step)["loss"])
            if (step + 1) % args.eval_every == 0:
                family = args.then if args.then and step >= args.switch else args.statements
                print(json.dumps({"step": step + 1, "statements": family,
                                  "loss": float(np.mean(losses[-args.eval_every:])), **evaluate(trainer.params),
                                  "seconds": round(time.time() - started)}), flush=True)


if __name__ == "__main__":
    main()
