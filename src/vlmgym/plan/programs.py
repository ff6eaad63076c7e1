"""Compile the trainer's and the rollout engine's jitted functions for abstract inputs; read XLA's memory analysis.

The functions are the ones the trainer calls (`grpo_gradients` or `sft_gradients`, `apply_update`, the rollout
engine's `_prefill_group` and `_decode_loop`), with the same static arguments and the same input shardings
(params by `sharding.param_shardings`, learner batches by `policy.learner_batch_shardings`, host arrays
replicated). Their outputs are laid out as XLA lays them out for the trainer (which passes no out_shardings):
each program's output shardings are read back from the compiled program and passed on as the next program's
input shardings (gradients -> update, optimizer init -> update, prefill -> decode loop), so nothing is assumed
replicated that the real step does not replicate.
"""

from __future__ import annotations

import contextlib
import sys
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vlmgym.models.family import family_of
from vlmgym.models.qwen3_vl import lora
from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.mesh import make_mesh, param_shardings
from vlmgym.params import ObjectiveParams
from vlmgym.plan.shapes import PlanSpec, abstract, learner_micro, rollout_prompts
from vlmgym.rl.loop import CompileCounter
from vlmgym.rl.optim import Optimizer, OptimizerConfig, SubsetOptimizer, trainable_mask
from vlmgym.rl.policy import Qwen3VLLearner, learner_batch_shardings
from vlmgym.rl.update import apply_update, grpo_gradients, sft_gradients
from vlmgym.rollout.engine import _decode_loop, _prefill_group
from vlmgym.rollout.sampling import SamplingSettings


def memory(compiled: Any, args: Any) -> dict[str, int]:
    """Per-device bytes of one compiled program (XLA's buffer assignment) called with `args`.

    XLA counts only the arguments the program reads (jit drops unused ones, e.g. the vision weights from the
    decode loop), while all of them stay alive: `live_arguments` sums every argument's shard. peak = live
    arguments + outputs - aliases (outputs written into donated arguments) + temporaries."""
    m = compiled.memory_analysis()
    out = {"arguments": int(m.argument_size_in_bytes), "live_arguments": device_bytes(args),
           "outputs": int(m.output_size_in_bytes), "aliases": int(m.alias_size_in_bytes),
           "temporaries": int(m.temp_size_in_bytes)}
    out["peak"] = (max(out["arguments"], out["live_arguments"]) + out["outputs"] - out["aliases"]
                   + out["temporaries"])
    return out


def device_bytes(tree: Any) -> int:
    """Bytes per device of a tree of sharded arrays or ShapeDtypeStructs (each leaf's shard shape)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        total += int(np.prod(shape)) * leaf.dtype.itemsize  # (a PRNG key dtype has one too)
    return total


def outputs_of(compiled: Any, fn: Any, *args: Any) -> Any:
    """The compiled program's outputs as ShapeDtypeStructs with the shardings XLA chose."""
    shapes = jax.eval_shape(fn, *args)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
                        compiled.output_shardings)


class Planner:
    """Holds the abstract, sharded params and the trainer's static arguments for one PlanSpec."""

    def __init__(self, cfg: Qwen3VLConfig, spec: PlanSpec, mesh: Mesh | None = None):
        self.cfg, self.spec = cfg, spec
        self.mesh = mesh or make_mesh(*spec.mesh)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.params = abstract(family_of(cfg).abstract_params(cfg), param_shardings(cfg, self.mesh))
        if spec.lora_rank:
            self.params = self._with_adapters(spec.lora_rank)
            self.optimizer = SubsetOptimizer(OptimizerConfig(learning_rate=1e-6), lora.trainable_mask(self.params))
        else:
            self.optimizer = Optimizer(OptimizerConfig(learning_rate=1e-6), trainable_mask(self.params, spec.freeze))
        self.policy = Qwen3VLLearner(cfg, SamplingSettings(max_new_tokens=spec.answer), mesh=self.mesh,
                                     share_prefix=spec.share_prefix and spec.group > 1, remat=spec.remat)
        self.compiles = CompileCounter()
        self.compiled: dict[str, Any] = {}  # each program compiled so far, by name (a test runs them for real)

    def _with_adapters(self, rank: int) -> Any:
        """The abstract params with the adapters `init_adapters` adds (replicated, as it places them)."""
        adapters = lora.LoRAConfig(rank=rank, targets=tuple(self.spec.lora_targets), vision=self.spec.lora_vision)
        adapted = jax.eval_shape(lambda p: lora.init_adapters(p, self.cfg, adapters), self.params)
        base = {jax.tree_util.keystr(path): leaf.sharding
                for path, leaf in jax.tree_util.tree_leaves_with_path(self.params)}

        def place(path: tuple, leaf: Any) -> Any:
            sharding = base.get(jax.tree_util.keystr(path), self.replicated)
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

        return jax.tree_util.tree_map_with_path(place, adapted)

    def host(self, tree: Any) -> Any:
        """Host arrays the trainer passes unplaced: replicated over the mesh."""
        return abstract(tree, jax.tree.map(lambda _: self.replicated, tree))

    def micro(self) -> dict[str, Any]:
        micro = learner_micro(self.cfg, self.spec)
        batch = micro.pop("batch")
        return {"batch": abstract(batch, learner_batch_shardings(batch, self.mesh)), **self.host(micro)}

    def gradients(self, micro: dict[str, Any]) -> tuple[Any, Any]:
        """(memory of the gradient program, its outputs (loss, grads, aux) as ShapeDtypeStructs)."""
        normalizer = jax.ShapeDtypeStruct((), jnp.float32, sharding=self.replicated)
        static = {"policy": self.policy, "optimizer": self.optimizer, "compiles": self.compiles}
        if self.spec.algorithm == "sft":
            fn = partial(sft_gradients, **static)
        else:
            objective = ObjectiveParams()  # the loss's defaults: clip 0.2 / 0.28, token mean, no KL
            fn = partial(grpo_gradients, objective=objective, **static)
        compiled = self.compiled["gradients"] = fn.func.lower(self.params, micro, normalizer, **fn.keywords).compile()
        return memory(compiled, (self.params, micro, normalizer)), outputs_of(compiled, fn, self.params, micro,
                                                                               normalizer)

    def opt_state(self) -> Any:
        """The optimizer state as the trainer creates it (`optimizer.init_placed(params)`)."""
        return abstract(jax.eval_shape(self.optimizer.init, self.params), self.optimizer.state_shardings(self.params))

    def update(self, opt_state: Any, grads: Any) -> Any:
        """Memory of the optimizer step (params and state donated, as in the trainer)."""
        compiled = self.compiled["update"] = apply_update.lower(self.params, opt_state, grads, optimizer=self.optimizer,
                                                                compiles=self.compiles).compile()
        return memory(compiled, (self.params, opt_state, grads))

    def rollout(self) -> tuple[dict[str, int], dict[str, int]]:
        """Memory of the prefill and of the decode loop of one sampling call (spec.batch / spec.group prompts)."""
        cfg, spec = self.cfg, self.spec
        prompts = self.host(rollout_prompts(cfg, spec))
        # LoRA samples with the adapters merged (policy.sampling_params): plain params of the base's shapes
        params = lora.strip(self.params) if spec.lora_rank else self.params
        settings = SamplingSettings(max_new_tokens=spec.answer, eos_ids=(cfg.vision_end_token_id,))
        prefill = self.compiled["rollout_prefill"] = _prefill_group.lower(params, cfg, prompts, spec.group,
                                                                          spec.answer).compile()
        logits, cache = outputs_of(prefill, lambda p, x: _prefill_group(p, cfg, x, spec.group, spec.answer),
                                   params, prompts)
        key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=self.replicated)
        live = jax.ShapeDtypeStruct((logits.shape[0],), jnp.bool_, sharding=self.replicated)
        first_row = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.replicated)
        decode_args = (params, logits, cache, key, live, first_row)
        decode = self.compiled["rollout_decode"] = _decode_loop.lower(params, cfg, settings, *decode_args[1:]).compile()
        return memory(prefill, (params, prompts)), memory(decode, decode_args)


def plan(planner: Planner, rollout: bool = True) -> dict[str, Any]:
    """Per-device bytes of each program of one training step and of the state living across them."""
    spec = planner.spec
    with contextlib.redirect_stdout(sys.stderr):  # the trainer's "compiling ..." lines
        micro = planner.micro()
        gradients, (_, grads, _) = planner.gradients(micro)
        opt_state = planner.opt_state()
        programs = {"gradients": gradients, "update": planner.update(opt_state, grads)}
        if rollout and spec.algorithm != "sft":
            programs["rollout_prefill"], programs["rollout_decode"] = planner.rollout()
    state = {"params": device_bytes(planner.params), "opt_state": device_bytes(opt_state),
             "grads": device_bytes(grads), "micro_batch": device_bytes(micro)}
    # Buffers alive beside a program: the optimizer state while gradients are taken (and while sampling); under
    # gradient accumulation the running gradient sum and the step's other micro-batches (placed up front).
    accumulation = (state["grads"] + (spec.micro_batches - 1) * state["micro_batch"]
                    if spec.micro_batches > 1 else 0)
    peaks = {"learner": max(programs["gradients"]["peak"] + state["opt_state"] + accumulation,
                            programs["update"]["peak"])}
    if "rollout_decode" in programs:
        # LoRA: the merged kernels the engine samples with live beside the adapted params
        merged = sum(device_bytes(d["kernel"]) for d in lora.adapted_denses(planner.params).values())
        if merged:
            state["merged_kernels"] = merged
        peaks["rollout"] = state["opt_state"] + merged + max(programs["rollout_prefill"]["peak"],
                                                             programs["rollout_decode"]["peak"])
    peaks["step"] = max(peaks.values())
    trained = [leaf for leaf, t in zip(jax.tree.leaves(planner.params), jax.tree.leaves(planner.optimizer.trainable))
               if t]
    return {"programs": programs, "state": state, "peak": peaks,
            "trainable_parameters": int(sum(int(np.prod(leaf.shape)) for leaf in trained))}
