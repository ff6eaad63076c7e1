"""Map the logical axis names of the params (params.param_axes) onto a (data, fsdp, tensor) device mesh.

The same model code runs on one CPU, one host with several accelerators or many hosts: only
the mesh shape changes. A mesh axis of size 1 shards nothing, so on a single device every
rule degenerates to replication.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.weights import Params

MESH_AXES = ("data", "fsdp", "tensor")


@dataclass(frozen=True)
class ShardingRules:
    """Which mesh axis each logical axis is split over (None: replicated)."""

    batch: Any = ("data", "fsdp")
    """Activations and caches: examples are spread over every data-parallel device (plain DP and FSDP)."""
    embed: Any = "fsdp"
    """Text hidden dim of weights: FSDP shards parameter memory; weights are all-gathered per layer."""
    mlp: Any = "tensor"
    """SwiGLU inner dim: Megatron-style tensor parallelism (column-split gate/up, row-split down)."""
    q_heads: Any = "tensor"
    """Query heads (flattened heads*head_dim): whole heads per tensor shard when heads divide evenly."""
    kv_heads: Any = "tensor"
    """Key/value heads: same split as the queries so GQA groups stay on one shard."""
    vocab: Any = "tensor"
    """Embedding and lm_head rows: the largest single matrices, split like a column-parallel layer."""
    layers: Any = None
    """The stacked-layer axis is scanned over, so it must stay whole on every device."""
    vision: Any = None
    """The vision tower (~0.4B params, runs once per prompt) is replicated: sharding it buys little memory
    and costs collectives inside a short, latency-bound pass."""

    def table(self) -> list[tuple[str, Any]]:
        """(logical axis, mesh axes) pairs in the form flax's logical_to_mesh_* functions take."""
        vision_axes = ("vision_layers", "vision_embed", "vision_qkv", "vision_heads", "vision_mlp", "patch",
                       "vision_positions", "merger_in", "merger_mlp", "deepstack")
        return [("batch", self.batch), ("embed", self.embed), ("mlp", self.mlp), ("q_heads", self.q_heads),
                ("kv_heads", self.kv_heads), ("vocab", self.vocab), ("layers", self.layers),
                ("norm", None), ("head_dim", None), ("length", None)] + [
                    (name, self.vision) for name in vision_axes]


def _mesh_names(assignment: Any) -> set[str]:
    if assignment is None:
        return set()
    return {assignment} if isinstance(assignment, str) else {name for name in assignment if name is not None}


def logical_to_mesh_axes(axes: Sequence[str | None], table: Sequence[tuple[str, Any]]) -> PartitionSpec:
    """The mesh axes of an array's dimensions, as flax.linen.logical_to_mesh_axes gives them (rules in order of
    precedence; a rule applies to a dimension still unassigned when none of its mesh axes is taken yet; None where
    no rule applies). Written here so that a stage does not import flax (0.3-0.6 s) for this alone."""
    named = [name for name in axes if isinstance(name, str)]
    if len(named) != len(set(named)):
        raise ValueError(f"logical axes {tuple(axes)} name a dimension more than once")
    free = object()
    result: list[Any] = [free if isinstance(name, str) else name for name in axes]
    for logical, mesh_axes in table:
        if logical not in named:
            continue
        pos = list(axes).index(logical)
        taken = set().union(*(_mesh_names(r) for r in result if r is not free))
        if result[pos] is free and not _mesh_names(mesh_axes) & taken:
            result[pos] = mesh_axes
    return PartitionSpec(*(None if r is free else r for r in result))


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all); the sizes must multiply to the device count."""
    devices = list(devices if devices is not None else jax.devices())
    if data * fsdp * tensor != len(devices):
        raise ValueError(f"mesh {data}x{fsdp}x{tensor} needs {data * fsdp * tensor} devices, have {len(devices)}")
    return Mesh(np.array(devices).reshape(data, fsdp, tensor), MESH_AXES)


def _fit(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """Drop mesh axes that do not divide a dimension (tiny test models, odd vocab sizes) -> replicate it."""
    fitted = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = int(np.prod([mesh.shape[n] for n in names])) if names else 1
        fitted.append(axes if names and dim % size == 0 else None)
    return PartitionSpec(*fitted)


def logical_sharding(axes: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh,
                     rules: ShardingRules = ShardingRules()) -> NamedSharding:
    """NamedSharding of one array given its logical axis names."""
    spec = logical_to_mesh_axes(axes, rules.table())
    return NamedSharding(mesh, _fit(spec, shape, mesh))


def param_shardings(cfg: Qwen3VLConfig, mesh: Mesh, rules: ShardingRules = ShardingRules()) -> Params:
    """Tree of NamedSharding parallel to the params (of cfg's family: vlmgym.models.family)."""
    from vlmgym.models.family import family_of

    family = family_of(cfg)
    axes = family.param_axes(cfg)
    abstract = family.abstract_params(cfg)
    return jax.tree.map(lambda a, s: logical_sharding(a, s.shape, mesh, rules), axes, abstract,
                        is_leaf=lambda x: isinstance(x, tuple))


def shard_params(params: Params, cfg: Qwen3VLConfig, mesh: Mesh, rules: ShardingRules = ShardingRules()) -> Params:
    """Place params on the mesh."""
    return jax.device_put(params, param_shardings(cfg, mesh, rules))


def batch_sharding(mesh: Mesh, ndim: int, batch_axis: int = 0, batch: int | None = None,
                   rules: ShardingRules = ShardingRules()) -> NamedSharding:
    """Sharding of an activation / input array whose `batch_axis` is the batch (rest replicated)."""
    axes = tuple("batch" if i == batch_axis else None for i in range(ndim))
    spec = logical_to_mesh_axes(axes, rules.table())
    if batch is not None:
        shape = tuple(batch if i == batch_axis else 1 for i in range(ndim))
        spec = _fit(spec, shape, mesh)
    return NamedSharding(mesh, spec)


def cache_shardings(cache: dict[str, Any], mesh: Mesh, rules: ShardingRules = ShardingRules()) -> dict[str, Any]:
    """KV-cache shardings: batch over data/fsdp and kv heads over tensor (index replicated)."""
    batch = cache["valid"].shape[0]
    kv = logical_sharding(("layers", "batch", "length", "kv_heads", "head_dim"), cache["k"].shape, mesh, rules)
    row = batch_sharding(mesh, 1, 0, batch, rules)
    return {"k": kv, "v": kv, "valid": batch_sharding(mesh, 2, 0, batch, rules),
            "index": NamedSharding(mesh, PartitionSpec()), "next_position": row}
