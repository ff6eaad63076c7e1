"""How strong may geospot's out-of-distribution shift be before a policy falls to the image-blind floor?

For each strength of `data.geospot.ood_shift` (data.geospot.ood_strength), N test_ood scenes are rendered in
memory (the generator of params.yaml at that strength) and a policy answers them greedily; beside it the
image-blind floor on the same scenes: the policy with its images blanked, and the constant answer the rollout
stage chose on val (outputs/rollouts/summary.json). Printed per strength: each mean reward, and the policy minus
the higher floor with a paired bootstrap interval. Run after `dvc repro` (it reads models/jax/<policy>):

    python scripts/geospot/ood_strength.py [--policy sft] [--strengths 0.25 0.5 0.75 1] [--samples 200]

The scenes' places are drawn as for a one-image train split, so they are not the pipeline's test_ood places;
the choice of a default strength made from this is a choice on generated data, never on the test split.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from vlmgym.envs.geospot.env import GeospotEnv
from vlmgym.eval import blind
from vlmgym.eval.rollouts import answer_split, load_engine
from vlmgym.params import load_section
from vlmgym.stats.bootstrap import Statistic, paired_bootstrap_intervals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="sft", help="policy folder under rollout.models_dir")
    parser.add_argument("--strengths", type=float, nargs="+", default=[0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--samples", type=int, default=200, help="scenes rendered per strength")
    parser.add_argument("--seed", type=int, default=1, help="generator seed of the scenes (the pipeline's is 0)")
    args = parser.parse_args()
    data, rollout, model = load_section("data"), load_section("rollout"), load_section("model")
    env_params = load_section("env")
    summary = json.loads((Path(rollout.out_dir) / "summary.json").read_text())
    constant = summary[blind.CONSTANT]["answer"]
    engine, params = load_engine(Path(rollout.models_dir) / args.policy, max_new_tokens=rollout.max_new_tokens,
                                 dtype=model.dtype, param_dtype=model.param_dtype)
    world = GeospotEnv.data_settings(data)
    print(f"policy {args.policy}, {args.samples} scenes per strength, shift {world.ood_shift}; constant "
          f"{constant!r}")
    print("strength | policy | blanked | constant | policy - max(floor) [95%]")
    for strength in args.strengths:
        shifted = dataclasses.replace(data, sections={**data.sections, "geospot": dataclasses.replace(
            world, ood_strength=strength)})
        samples = GeospotEnv.generate(args.samples, seed=args.seed, split="test_ood", data=shifted)
        env = GeospotEnv(samples, tokenizer=engine.processor.tokenizer, params=env_params.settings(),
                         progress=rollout.progress)
        answers = {"policy": answer_split(engine, params, env, policy=args.policy, batch_size=rollout.batch_size,
                                          show_progress=False)[0],
                   "blanked": answer_split(engine, params, env, policy="blind", batch_size=rollout.batch_size,
                                           show_progress=False, blank_images=True)[0],
                   "constant": blind.constant_records(env, constant)}
        rewards = {k: np.array([r["reward"] for r in v], np.float64) for k, v in answers.items()}
        floor = "blanked" if rewards["blanked"].mean() >= rewards["constant"].mean() else "constant"
        diff = paired_bootstrap_intervals({"r": Statistic("mean", rewards["policy"])},
                                          {"r": Statistic("mean", rewards[floor])}, n_resamples=1000)["r"]
        print(f"{strength:g} | {rewards['policy'].mean():.3f} | {rewards['blanked'].mean():.3f} | "
              f"{rewards['constant'].mean():.3f} | {diff.estimate:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}]",
              flush=True)


if __name__ == "__main__":
    main()
