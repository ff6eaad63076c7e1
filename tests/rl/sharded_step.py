"""Run by test_sharded.py in a subprocess with 4 fake CPU devices: one GRPO update, single device vs a mesh."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from conftest import geo_samples

from vlmgym.envs.geospot import GeospotEnv
from vlmgym.models.qwen3_vl.config import load_hf_config
from vlmgym.models.qwen3_vl.convert import hf_to_params, read_safetensors
from vlmgym.models.qwen3_vl.mesh import make_mesh, shard_params
from vlmgym.models.qwen3_vl.processor import Processor
from vlmgym.params import ObjectiveParams
from vlmgym.rl.loop import CompileCounter
from vlmgym.rl.optim import Optimizer, OptimizerConfig, trainable_mask
from vlmgym.rl.policy import Qwen3VLPolicy
from vlmgym.rl.update import apply_update, grpo_gradients
from vlmgym.rollout.sampling import SamplingSettings

PLAIN = ObjectiveParams(epsilon=0.2, epsilon_high=0.28, loss_aggregation="token_mean", beta=0.0)
# Every objective knob of the loss on at once: GSPO's sequence ratio, the truncated sampler correction, the entropy
# mask (its quantile is taken over the whole batch, wherever its rows live).
KNOBS = ObjectiveParams(epsilon=0.2, epsilon_high=0.28, loss_aggregation="token_mean", beta=0.0,
                        importance_sampling_level="sequence", sampler_correction="token_truncate",
                        sampler_correction_cap=2.0, top_entropy_quantile=0.5)


def update(policy, params, micro, objective=PLAIN):
    optimizer = Optimizer(OptimizerConfig(learning_rate=1e-2), trainable_mask(params))
    compiles = CompileCounter()
    loss, grads, aux = grpo_gradients(params, micro, jnp.float32(micro["mask"].sum()), policy=policy,
                                      optimizer=optimizer, objective=objective, compiles=compiles)
    params, _, stats = apply_update(params, jax.jit(optimizer.init)(params), grads, optimizer=optimizer,
                                    compiles=compiles)
    return (float(loss), float(stats["grad_norm"]), jax.device_get(grads), aux["logprobs"],
            float(aux.get("entropy_kept", 0.0)))


def main(folder: str) -> None:
    assert len(jax.devices()) == 4, jax.devices()
    cfg = load_hf_config(folder)
    params = jax.tree.map(jnp.asarray, hf_to_params(read_safetensors(folder), cfg))
    processor = Processor.from_pretrained(folder)
    settings = SamplingSettings(max_new_tokens=8, eos_ids=tuple(processor.eos_token_ids),
                                pad_id=int(processor.pad_token_id))
    env = GeospotEnv(geo_samples())
    observations = [env.reset(i % 2)[1] for i in range(4)]
    single = Qwen3VLPolicy(cfg, processor, settings)
    tokens, mask = single.encode_targets(["Country: France", "Country", "City: Paris", "City"])
    inputs = {"advantages": np.array([1.0, -1.0, 0.5, -0.5], np.float32), "mask": mask,
              "behaviour": np.full(mask.shape, -3.0, np.float32) * mask}
    # update() donates the params it is given: keep the originals for the sharded run.
    one = update(single, jax.tree.map(jnp.copy, params),
                 {"batch": single.build_batch(observations, tokens, mask), **inputs})

    mesh = make_mesh(data=2, fsdp=2)
    sharded = Qwen3VLPolicy(cfg, processor, settings, mesh=mesh)
    batch = sharded.build_batch(observations, tokens, mask)
    many = update(sharded, shard_params(jax.tree.map(jnp.copy, params), cfg, mesh), {"batch": batch, **inputs})
    # Gradients relative to the largest one: reductions split over devices only reorder float sums.
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(one[2]))
    diff = max(float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
               for a, b in zip(jax.tree.leaves(one[2]), jax.tree.leaves(many[2]))) / scale
    out = {"loss": [one[0], many[0]], "grad_norm": [one[1], many[1]], "grad_diff": diff,
           "logprob_diff": float(np.abs(np.asarray(one[3]) - np.asarray(many[3])).max()),
           "input_sharding": str(batch["completion_ids"].sharding.spec)}

    # The shared-prefix update on the mesh (4 prompts x 2 completions, each group on one device) against the
    # per-copy update on one device.
    per_copy = Qwen3VLPolicy(cfg, processor, settings, share_prefix=False)
    group_tokens, group_mask = np.repeat(tokens, 2, axis=0), np.repeat(mask, 2, axis=0)
    group_mask[1::2, 1:] = 0  # the second completion of each group ends early
    group_inputs = {"advantages": np.tile([1.0, -1.0], 4).astype(np.float32), "mask": group_mask,
                    "behaviour": np.full(group_mask.shape, -3.0, np.float32) * group_mask}
    one = update(per_copy, jax.tree.map(jnp.copy, params),
                 {"batch": per_copy.build_batch(observations, group_tokens, group_mask), **group_inputs})
    shared_batch = sharded.build_batch(observations, group_tokens, group_mask)
    many = update(sharded, shard_params(jax.tree.map(jnp.copy, params), cfg, mesh),
                  {"batch": shared_batch, **group_inputs})
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(one[2]))
    out["shared"] = {
        "loss": [one[0], many[0]], "prompts": int(shared_batch["inputs"]["input_ids"].shape[0]),
        "grad_diff": max(float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
                         for a, b in zip(jax.tree.leaves(one[2]), jax.tree.leaves(many[2]))) / scale,
        "logprob_diff": float(np.abs(np.asarray(one[3]) - np.asarray(many[3])).max()),
        "prompt_sharding": str(shared_batch["inputs"]["input_ids"].sharding.spec),
        "row_sharding": str(shared_batch["completion_ids"].sharding.spec)}

    # The same shared-prefix update with every knob on, against the per-copy one on one device.
    knob_inputs = {**group_inputs, "sampler": group_inputs["behaviour"] - 0.3 * group_mask}
    one = update(per_copy, jax.tree.map(jnp.copy, params),
                 {"batch": per_copy.build_batch(observations, group_tokens, group_mask), **knob_inputs}, KNOBS)
    many = update(sharded, shard_params(jax.tree.map(jnp.copy, params), cfg, mesh),
                  {"batch": shared_batch, **knob_inputs}, KNOBS)
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(one[2]))
    out["knobs"] = {"loss": [one[0], many[0]], "kept": [one[4], many[4]], "scale": scale,
                    "grad_diff": max(float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
                                     for a, b in zip(jax.tree.leaves(one[2]), jax.tree.leaves(many[2]))) / scale}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
