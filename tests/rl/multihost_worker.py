"""Run by test_multihost.py: GRPO steps of the tiny model over a 2-device data mesh, either in one process with 2
fake CPU devices or as one of two processes (jax.distributed over gloo, one CPU device each). Process 0 writes the
final params (.npz) and the per-step figures (.json).

    python multihost_worker.py MODEL_DIR CHECKPOINT_DIR OUT_PREFIX STEPS [--hang-at STEP] [--filter] [--knobs]

--filter: filter_groups on the answers' `long` component (each process refills its own prompts); every process
also writes its data order (OUT_PREFIX.<process>.data.json).
--knobs: every objective knob of the loss and the reward on at once (KNOBS).
"""

import argparse
import dataclasses
import json
import time

from vlmgym.runtime import distributed

settings = distributed.settings_from()
distributed.initialize(settings)  # before any other JAX work

import jax  # noqa: E402
import numpy as np  # noqa: E402
from conftest import geo_samples  # noqa: E402

from vlmgym.envs.geospot import GeospotEnv  # noqa: E402
from vlmgym.models.qwen3_vl.config import load_hf_config  # noqa: E402
from vlmgym.models.qwen3_vl.convert import hf_to_params, read_safetensors  # noqa: E402
from vlmgym.models.qwen3_vl.mesh import make_mesh, param_shardings  # noqa: E402
from vlmgym.models.qwen3_vl.processor import Processor  # noqa: E402
from vlmgym.params import ObjectiveParams, TrainParams, with_values  # noqa: E402
from vlmgym.rl import trainer_parts as trainer_module  # noqa: E402
from vlmgym.rl.grpo_trainer import GRPOTrainer  # noqa: E402
from vlmgym.rl.policy import Qwen3VLPolicy  # noqa: E402
from vlmgym.rollout.sampling import SamplingSettings  # noqa: E402

# Adam's eps: at the default 1e-8 Adam's first update, lr * g / (|g| + eps), turns a last-bit difference in an
# element whose gradient is ~1e-8 (a cancellation) into a few percent of lr. XLA does not promise the same last
# bits from a two-process and a one-process program (on an Intel Xeon they differ; on an AMD EPYC they did not), so
# with it the comparison measured rounding luck. At 1e-3 last-bit differences stay last-bit and a real difference
# (a missed all-reduce, a wrong data shard) is still of the order of the update itself.
ADAM_EPS = 1e-3
_optimizer_config = trainer_module.optimizer_config
trainer_module.optimizer_config = lambda section: dataclasses.replace(_optimizer_config(section), eps=ADAM_EPS)

# GSPO's sequence ratio, the learner's old log-probs with the truncated sampler correction, the entropy mask (a
# quantile over the whole batch, across processes), truncated answers masked and DAPO's overlong penalty.
KNOBS = {"old_logprobs": "learner", "objective": ObjectiveParams(
    importance_sampling_level="sequence", sampler_correction="token_truncate", sampler_correction_cap=2.0,
    top_entropy_quantile=0.5, mask_truncated_completions=True, overlong_buffer=4, overlong_penalty=0.5)}

FIGURES = ("reward_mean", "reward_std", "loss", "grad_norm", "completion_length")


class LengthEnv(GeospotEnv):
    """geospot prompts with a reward the random tiny model varies on: its answer's length (and a component that
    only some groups vary on: whether the answer is long)."""

    def score(self, state, text):
        _, info = super().score(state, text)
        info["reward_components"] = {**info["reward_components"], "long": float(len(text) >= 24)}
        return min(len(text), 40) / 40, info


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("model", "checkpoints", "out"):
        parser.add_argument(name)
    parser.add_argument("steps", type=int)
    parser.add_argument("--hang-at", type=int, default=0, help="process 1 stops responding after this step")
    parser.add_argument("--filter", action="store_true", help="filter groups on the `long` component")
    parser.add_argument("--knobs", action="store_true", help="every loss and reward knob on (KNOBS)")
    args = parser.parse_args()
    assert jax.device_count() == 2, jax.devices()
    cfg = load_hf_config(args.model)
    processor = Processor.from_pretrained(args.model)
    mesh = make_mesh(data=2)
    params = distributed.put_global(hf_to_params(read_safetensors(args.model), cfg), param_shardings(cfg, mesh))
    config = with_values(TrainParams(steps=args.steps, batch_prompts=2, group_size=4, max_new_tokens=8, seed=3,
                                     **({"filter_groups": True, "filter_metric": "long", "max_sample_rounds": 3}
                                        if args.filter else {}), **(KNOBS if args.knobs else {})), {
        "optimizer.lr": 1e-2, "validation.every": 0, "validation.select": "last", "optimizer.warmup_steps": 0,
        "checkpointing.every": 1})
    settings = SamplingSettings(max_new_tokens=8, eos_ids=tuple(processor.eos_token_ids),
                                pad_id=int(processor.pad_token_id))
    policy = Qwen3VLPolicy(cfg, processor, settings, mesh=mesh)
    env = LengthEnv(geo_samples(), tokenizer=processor.tokenizer)

    def figures(step, metrics):
        if step == args.hang_at and jax.process_index() == 1:
            with open(args.out + ".hung", "w") as f:  # the test kills this process once it sees the file
                f.write(str(step))
            time.sleep(3600)

    trainer = GRPOTrainer(policy, env, params, config, args.checkpoints, progress_bar=False,
                          metrics_callback=figures)
    with distributed.exit_together("multihost_worker"):
        final = trainer.run()
        leaves = {jax.tree_util.keystr(path): distributed.host_value(leaf)
                  for path, leaf in jax.tree_util.tree_leaves_with_path(final)}
    if args.filter:
        with open(f"{args.out}.{jax.process_index()}.data.json", "w") as f:
            json.dump(trainer.loop_state(), f)
    if distributed.is_primary():
        np.savez(args.out + ".npz", **leaves)
        names = FIGURES + (("sample_rounds", "groups_dropped", "zero_std_group_share") if args.filter else ())
        names += ("truncated_share", "sampler_weight_mean", "entropy_kept") if args.knobs else ()
        history = [{name: m[name] for name in names} for m in trainer.history]
        with open(args.out + ".json", "w") as f:
            json.dump({"history": history, "resumed_from": trainer.resumed_from,
                       "processes": jax.process_count()}, f)


if __name__ == "__main__":
    main()
