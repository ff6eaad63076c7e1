"""Median GRPO update_time_s of the default train config from models/jax/sft, shared prefix vs per copy (12 steps
each). Run from the repository root after `dvc repro`: python scripts/learner_step_time.py"""
import json
import statistics
import tempfile

from vlmgym import envs
from vlmgym.params import load_section, with_values
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.stage_setup import load_policy

model, train = load_section("model"), load_section("train")
out = {}
for share in (True, False):
    policy, params = load_policy(train.init_dir, model, train.max_new_tokens, share_prefix=share)
    env = envs.from_params(load_section("env"), shards_dir=train.shards_dir, split="train",
                           tokenizer=policy.processor.tokenizer)
    config = with_values(train, {"steps": 12, "checkpointing.every": 100, "validation.every": 0,
                                 "validation.select": "last"})
    with tempfile.TemporaryDirectory() as tmp:
        trainer = GRPOTrainer(policy, env, params, config, tmp, progress_bar=False)
        trainer.run()
    times = [m["update_time_s"] for m in trainer.history[2:]]
    first = [round(m["reward_mean"], 4) for m in trainer.history[:3]]
    out["shared" if share else "per_copy"] = {"median_update_time_s": statistics.median(times),
                                              "reward_mean_first_steps": first}
print(json.dumps(out))
