"""Low-rank adapters (LoRA) on the Qwen3-VL dense projections: init, apply, merge, strip and the PEFT layout.

An adapted projection is its dense dict with three more leaves, stacked like the kernel over layers:
`lora_a` (in, r), `lora_b` (r, out) and `lora_scale` (alpha / r, one per layer), all float32 (tiny beside the
base, and the optimizer then needs no fp32 master copy). `project` computes x W + scale * (x A) B, so the
forward stays factored (the backward never forms a dense weight gradient) and a tree without adapter leaves
runs exactly the old program. B starts at 0: the adapted model's outputs equal the base's at step 0.

Dropout (PEFT's `lora_dropout`: on the adapter's input, x W + scale * (drop(x) A) B) exists only in a training
forward: the trainers give each micro-batch a key (`dropout_inputs`), and `train_mode` attaches per-layer keys and
the rate to the adapted dense dicts inside the differentiated loss. Every other forward (sampling, the reference,
validation, PPO's values) sees a tree without those leaves and runs with dropout off.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.config.sections import LoRAParams
from vlmgym.models.names import QWEN2_5_VL, QWEN3_VL
from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.weights import Params

ADAPTER_LEAVES = ("lora_a", "lora_b", "lora_scale")
TRAINED_LEAVES = ("lora_a", "lora_b")
DROPOUT_LEAVES = ("lora_dropout_key", "lora_dropout_rate")  # a training forward's only (see train_mode)
DROPOUT_STREAM = 0x64726F70  # folded into the lora seed: the dropout keys are not the init's A keys
TEXT_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
VISION_TARGETS = ("qkv", "proj", "fc1", "fc2")
# HF module names (under `model.`) of each adapted projection, for the PEFT adapter folder.
HF_TEXT = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
HF_VISION = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.linear_fc1", "fc2": "mlp.linear_fc2"}
# Qwen2.5-VL's vision blocks (vlmgym.models.qwen2_5_vl) have a gated MLP; attention is named as Qwen3-VL's.
HF_VISION_QWEN2_5 = {"qkv": "attn.qkv", "proj": "attn.proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
                     "down": "mlp.down_proj"}
VISION_LORA = {QWEN3_VL: HF_VISION, QWEN2_5_VL: HF_VISION_QWEN2_5}  # per family (config.json model_type)


@dataclass(frozen=True)
class LoRAConfig:
    """What gets adapted and how (the `lora` sub-section of sft / train)."""

    rank: int
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = TEXT_TARGETS
    vision: bool = False
    seed: int = 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_section(cls, section: LoRAParams | None) -> LoRAConfig | None:
        """The adapters a params `lora` section asks for; None when rank is 0 (LoRA off)."""
        if section is None or section.rank == 0:
            return None
        return cls(rank=section.rank, alpha=section.alpha, dropout=section.dropout, targets=tuple(section.targets),
                   vision=section.vision, seed=section.seed)


def project(x: jax.Array, p: Params) -> jax.Array:
    """x @ kernel, plus the adapter's scale * (x A) B when `p` holds one (p already in the compute dtype)."""
    y = x @ p["kernel"]
    if "lora_a" not in p:
        return y
    return y + ((adapter_input(x, p) @ p["lora_a"]) @ p["lora_b"]) * p["lora_scale"]


def adapter_input(x: jax.Array, p: Params) -> jax.Array:
    """What the adapter's A sees: x, or in a training forward (`train_mode`) x with each element dropped at the
    rate and the rest scaled by 1 / (1 - rate) (inverted dropout, as torch.nn.Dropout)."""
    if "lora_dropout_key" not in p:
        return x
    rate = p["lora_dropout_rate"].astype(jnp.float32)
    keep = jax.random.bernoulli(p["lora_dropout_key"], 1.0 - rate, x.shape)
    return jnp.where(keep, x.astype(jnp.float32) / (1.0 - rate), 0.0).astype(x.dtype)


def dropout_inputs(lora: LoRAConfig | None, step: int, iteration: int, index: int) -> dict[str, np.ndarray]:
    """What a micro-batch carries into a training forward for adapter dropout: a key for (step, iteration,
    micro-batch), so a resumed run draws the same masks, and the rate; nothing when dropout is off."""
    if lora is None or lora.dropout == 0:
        return {}
    key = jax.random.fold_in(jax.random.key(lora.seed), DROPOUT_STREAM)
    for part in (step, iteration, index):
        key = jax.random.fold_in(key, part)
    return {"dropout_key": np.asarray(jax.random.key_data(key)), "dropout_rate": np.float32(lora.dropout)}


def train_mode(params: Params, micro: dict) -> Params:
    """`params` for a training forward of `micro`: with dropout leaves on every adapter when the micro-batch
    carries a dropout key (`dropout_inputs`), else `params` itself. Traced inside the loss, after the gradient's
    inputs are taken: the keys and rate are never differentiated, stored or seen by another forward."""
    if "dropout_key" not in micro:
        return params
    key = jax.random.wrap_key_data(micro["dropout_key"])
    for index, path in enumerate(adapted_paths(params)):
        dense = _get(params, path)
        layers = dense["lora_a"].shape[0]
        leaves = {"lora_dropout_key": jax.random.split(jax.random.fold_in(key, index), layers),
                  "lora_dropout_rate": jnp.full((layers,), micro["dropout_rate"], jnp.float32)}
        params = _replace(params, path, {**dense, **leaves})
    return params


def _targets(cfg: Qwen3VLConfig, lora: LoRAConfig) -> list[tuple[tuple[str, ...], int]]:
    """(params path of the dense dict, stacked count) of every adapted projection."""
    out = [(("text", "layers", name), cfg.text.num_hidden_layers) for name in TEXT_TARGETS if name in lora.targets]
    if lora.vision:  # every projection of the family's vision blocks
        out += [(("visual", "blocks", name), cfg.vision.depth) for name in VISION_LORA[cfg.family]]
    return out


def _get(tree: Params, path: tuple[str, ...]) -> Any:
    for name in path:
        tree = tree[name]
    return tree


def _replace(tree: Params, path: tuple[str, ...], value: Any) -> Params:
    """A shallow copy of `tree` with the dict at `path` replaced (no array is copied)."""
    if not path:
        return value
    return {**tree, path[0]: _replace(tree[path[0]], path[1:], value)}


def init_adapters(params: Params, cfg: Qwen3VLConfig, lora: LoRAConfig) -> Params:
    """`params` with fresh adapters attached: A ~ kaiming-uniform like PEFT's default (bound 1/sqrt(in)), B = 0."""
    key = jax.random.key(lora.seed)
    for index, (path, layers) in enumerate(_targets(cfg, lora)):
        dense = _get(params, path)
        if "lora_a" in dense:
            raise ValueError(f"{'/'.join(path)} already has an adapter")
        n_in, n_out = dense["kernel"].shape[-2:]
        bound = 1.0 / math.sqrt(n_in)
        a = jax.random.uniform(jax.random.fold_in(key, index), (layers, n_in, lora.rank), jnp.float32, -bound, bound)
        sharding = getattr(dense["kernel"], "sharding", None)
        adapter = {"lora_a": a, "lora_b": jnp.zeros((layers, lora.rank, n_out), jnp.float32),
                   "lora_scale": jnp.full((layers,), lora.scale, jnp.float32)}
        if isinstance(sharding, jax.sharding.NamedSharding):  # adapters are small: replicated on the params' mesh
            replicated = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
            adapter = jax.device_put(adapter, replicated)
        params = _replace(params, path, {**dense, **adapter})
    return params


def adapted_paths(params: Params) -> list[tuple[str, ...]]:
    """Params paths of the dense dicts that hold an adapter (sorted)."""
    found = []

    def walk(tree: Any, path: tuple[str, ...]) -> None:
        if isinstance(tree, dict):
            if "lora_a" in tree:
                found.append(path)
            for name, sub in tree.items():
                walk(sub, path + (name,))

    walk(params, ())
    return sorted(found)


def has_adapters(params: Any) -> bool:
    return isinstance(params, dict) and bool(adapted_paths(params))


def trainable_mask(params: Params) -> Params:
    """True exactly at the adapters' A and B leaves."""
    def leaf(path: tuple, _: Any) -> bool:
        return getattr(path[-1], "key", None) in TRAINED_LEAVES
    return jax.tree_util.tree_map_with_path(leaf, params)


def strip(params: Params) -> Params:
    """The base model inside an adapted tree: the same arrays, adapter leaves left out (no copy)."""
    for path in adapted_paths(params):
        dense = _get(params, path)
        params = _replace(params, path, {k: v for k, v in dense.items() if k not in ADAPTER_LEAVES})
    return params


def adapters(params: Params) -> dict[str, Any]:
    """Only the adapter leaves, as {'text/layers/q': {'lora_a', 'lora_b', 'lora_scale'}} (what a checkpoint holds)."""
    return {"/".join(path): {k: _get(params, path)[k] for k in ADAPTER_LEAVES} for path in adapted_paths(params)}


def attach(base: Params, saved: dict[str, Any]) -> Params:
    """`base` with the adapters of `adapters(...)` put back in place."""
    for joined, adapter in saved.items():
        path = tuple(joined.split("/"))
        params_dense = _get(base, path)
        base = _replace(base, path, {**params_dense, **adapter})
    return base


def merged_kernel(dense: Params) -> jax.Array:
    """W + scale * A B of one adapted dense dict (in fp32, then W's dtype)."""
    delta = jnp.einsum("lir,lro->lio", dense["lora_a"], dense["lora_b"], precision="highest")
    kernel = dense["kernel"].astype(jnp.float32) + dense["lora_scale"][:, None, None] * delta
    return kernel.astype(dense["kernel"].dtype)


def adapted_denses(params: Params) -> dict[str, Params]:
    """{'text/layers/q': its dense dict} of every adapted projection."""
    return {"/".join(path): _get(params, path) for path in adapted_paths(params)}


def with_kernels(params: Params, kernels: dict[str, jax.Array]) -> Params:
    """`params` without adapters, the kernels of `kernels` (by `adapted_denses` key) swapped in; every other leaf
    is the same array."""
    for joined, kernel in kernels.items():
        path = tuple(joined.split("/"))
        plain = {k: v for k, v in _get(params, path).items() if k not in ADAPTER_LEAVES}
        params = _replace(params, path, {**plain, "kernel": kernel})
    return params


def merge(params: Params) -> Params:
    """The plain model equal to the adapted one: every adapted kernel W + scale * A B."""
    return with_kernels(params, {k: merged_kernel(d) for k, d in adapted_denses(params).items()})


def peft_state(params: Params, dropout: float = 0.0) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The adapters as PEFT names them on transformers' Qwen3VLForConditionalGeneration or
    Qwen2_5_VLForConditionalGeneration (the same module names but for the vision MLP) (lora_A (r, in),
    lora_B (out, r), float32) and the adapter_config.json fields that load them (`dropout`: the rate trained with,
    which PEFT applies only when training the adapter further)."""
    state, templates, rank, scale = {}, set(), None, None
    for path in adapted_paths(params):
        dense = _get(params, path)
        a, b = np.asarray(dense["lora_a"], np.float32), np.asarray(dense["lora_b"], np.float32)
        scales = np.asarray(dense["lora_scale"], np.float32)
        rank = a.shape[-1] if rank is None else rank
        scale = float(scales[0]) if scale is None else scale
        if a.shape[-1] != rank or not np.all(scales == scale):
            raise ValueError("PEFT needs one rank and one alpha for every adapter")
        tower, _, name = path
        hf = (f"visual.blocks.{{}}.{(HF_VISION | HF_VISION_QWEN2_5)[name]}" if tower == "visual"
              else f"language_model.layers.{{}}.{HF_TEXT[name]}")
        templates.add(hf)
        for layer in range(a.shape[0]):
            module = "model." + hf.format(layer)
            state[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(a[layer].T)
            state[f"base_model.model.{module}.lora_B.weight"] = np.ascontiguousarray(b[layer].T)
    if rank is None:
        raise ValueError("no adapters in these params")
    # A regex over full module names: a list of suffixes like 'linear_fc1' would also hit the vision mergers.
    target = "(?:" + "|".join(sorted(re.escape("model." + t).replace(r"\{\}", r"\d+") for t in templates)) + ")"
    config = {"peft_type": "LORA", "task_type": None, "r": int(rank), "lora_alpha": float(scale * rank),
              "lora_dropout": float(dropout), "target_modules": target, "bias": "none", "fan_in_fan_out": False,
              "inference_mode": True, "modules_to_save": None, "use_rslora": False, "use_dora": False,
              "init_lora_weights": True, "layers_to_transform": None, "layers_pattern": None,
              "rank_pattern": {}, "alpha_pattern": {}}
    return state, config


ADAPTER_DIR = "adapter"  # inside a model folder written by a LoRA run: the adapters alone, in PEFT's layout
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
BASE_FILE = "vlmgym_base.json"  # the base folder the adapters sit on and its folder_identity hash


def write_peft_adapter(folder: str | Path, params: Params, base: str, base_identity: str,
                       dropout: float = 0.0) -> Path:
    """`params`' adapters as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) into the new
    folder `folder` (the caller makes it atomic). `base`: the base model they sit on (adapter_config's
    base_model_name_or_path); `base_identity`: its folder hash, kept in the safetensors metadata."""
    from safetensors.numpy import save_file

    state, config = peft_state(params, dropout)
    folder = Path(folder)
    folder.mkdir(parents=True)
    save_file(state, str(folder / PEFT_WEIGHTS), metadata={"format": "pt", "vlmgym_base_identity": base_identity})
    (folder / PEFT_CONFIG).write_text(json.dumps({**config, "base_model_name_or_path": str(base)}, indent=2) + "\n")
    # PEFT warns about unknown adapter_config keys: the base's identity goes beside it
    (folder / BASE_FILE).write_text(json.dumps({"base": str(base), "identity": base_identity}) + "\n")
    return folder
