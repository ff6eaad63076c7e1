"""Can a model's vision features see nlvr2's shapes? Linear probes of per-image facts on the image tokens.

For the first N train pairs, the image tokens the LLM receives (mean- and max-pooled per image) feed a linear
(ridge, on standardised features) classifier per fact: each colour present in the image, and 4+ shapes; 3/4 of
the images train it, the rest score it. Run where the nlvr2 shards and a model folder exist (after
`dvc exp run -S env.name=nlvr2`, or `dvc repro shard convert` with env.name: nlvr2 in params.yaml):

    python scripts/nlvr2/probe.py [--model models/jax/base] [--max-pixels 49152] [--pairs 800]

The scene descriptions come from the generator itself (the seed, size and data.nlvr2 settings of params.yaml). The
numbers in docs/envs/nlvr2.md are on the full generator (data.nlvr2 as in its full-generator command).
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import numpy as np

from vlmgym import envs
from vlmgym.envs.nlvr2.data import COLOURS, generate_split
from vlmgym.envs.nlvr2.env import NLVR2Env
from vlmgym.models.qwen3_vl.model import encode_inputs
from vlmgym.params import load_section
from vlmgym.rl.stage_setup import load_policy

RIDGE = 10.0  # L2 strength of the probe (features standardised)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/jax/base", help="JAX model folder whose vision tower is probed")
    parser.add_argument("--max-pixels", type=int, default=0, help="image budget override (0: the model's own)")
    parser.add_argument("--pairs", type=int, default=800, help="train pairs used (two images each)")
    args = parser.parse_args()
    data = load_section("data")
    # the scenes the shards were rendered from: the configured generator (data.nlvr2), not generate_split's defaults
    settings = NLVR2Env.data_settings(data)
    knobs = settings.knobs()
    policy, params = load_policy(args.model, load_section("model"), 8)
    if args.max_pixels:
        policy.processor.settings = dataclasses.replace(policy.processor.settings, max_pixels=args.max_pixels)
    env = envs.from_params(load_section("env"), shards_dir="data/shards", split="train", limit=args.pairs)
    scenes = {p.id: (p.left, p.right)
              # every train pair: the shard stage held some out as val, so the first N served are not pairs 0..N-1
              for p in generate_split(data.seed, "train", settings.train_pairs or data.train_images, data.image_width,
                                      data.image_height, **knobs)}
    encode = jax.jit(lambda prm, inputs: encode_inputs(prm, policy.cfg, inputs)[0])
    features, facts = [], []
    for start in range(0, len(env), 16):
        resets = [env.reset(i) for i in range(start, min(start + 16, len(env)))]
        batch = policy.build_batch([obs for _, obs in resets], np.zeros((len(resets), 4), np.int32),
                                   np.ones((len(resets), 4), np.float32))
        tokens = np.asarray(encode(params, batch["inputs"]))
        per_image = tokens.shape[0] // (2 * len(resets))  # patches are padded at the end only
        tokens = tokens[: 2 * len(resets) * per_image].reshape(len(resets), 2, per_image, -1)
        for row, (state, _) in enumerate(resets):
            for side, scene in enumerate(scenes[state.meta["id"]]):
                features.append(np.concatenate([tokens[row, side].mean(0), tokens[row, side].max(0)]))
                facts.append([any(o.colour == c for o in scene) for c in sorted(COLOURS)] + [len(scene) >= 4])
    x, y = np.array(features), np.array(facts)
    split = len(x) * 3 // 4
    print(f"{per_image} image tokens per image, {len(x)} images")
    mean, std = x[:split].mean(0), x[:split].std(0) + 1e-6
    x = np.concatenate([(x - mean) / std, np.ones((len(x), 1))], axis=1)
    for k, name in enumerate([*sorted(COLOURS), "4+ shapes"]):
        target = y[:split, k].astype(np.float64)
        weights = np.linalg.solve(x[:split].T @ x[:split] + RIDGE * np.eye(x.shape[1]), x[:split].T @ target)
        accuracy = np.mean((x[split:] @ weights > 0.5) == y[split:, k])
        majority = max(y[split:, k].mean(), 1 - y[split:, k].mean())
        print(f"{name}: majority {majority:.3f}, probe {accuracy:.3f}")


if __name__ == "__main__":
    main()
