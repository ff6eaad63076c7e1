"""HF safetensors <-> JAX params, orbax checkpoints, and export back to a transformers folder.

The checkpoint functions (save / load / convert / export / check) serve every model family: the family comes from
the config (`cfg.family`) or the folder's config.json (vlmgym.models.family), which brings its key table and
parameter layout; the key table below is Qwen3-VL's.

The key table is built from the config, so every expected tensor is known up front:
a checkpoint key that matches nothing, an expected key that is absent, or a shape that
differs is an error naming the key. Values are copied exactly (only transposed or
reshaped), so HF -> JAX -> HF is bit-exact, and `check_export` verifies it on the written folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy so safetensors can read bf16 as numpy)
import numpy as np
import orbax.checkpoint as ocp
from safetensors import safe_open
from safetensors.numpy import save_file

from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.lora import ADAPTER_DIR
from vlmgym.models.qwen3_vl.weights import Params, abstract_params
from vlmgym.runtime import distributed
from vlmgym.runtime.atomic import atomic_dir

# Files next to the weights that a transformers folder needs besides config + safetensors.
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
              "added_tokens.json", "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
              "video_preprocessor_config.json", "processor_config.json", "generation_config.json")
META_FILE = "vlmgym_checkpoint.json"
MAX_SHARD_BYTES = 4 * 1024**3


class ConversionError(ValueError):
    """A checkpoint does not match the architecture (names the key)."""


class ExportCheckFailed(RuntimeError):
    """The exported folder does not reproduce the JAX weights or does not load in transformers."""


def _key_table(cfg: Qwen3VLConfig) -> Iterator[tuple[str, tuple[str, ...], int | None, str]]:
    """(HF key without 'model.', params path, stacked index or None, kind: 'copy' | 'linear' | 'patch')."""
    yield "visual.patch_embed.proj.weight", ("visual", "patch_embed", "kernel"), None, "patch"
    yield "visual.patch_embed.proj.bias", ("visual", "patch_embed", "bias"), None, "copy"
    yield "visual.pos_embed.weight", ("visual", "pos_embed"), None, "copy"
    for i in range(cfg.vision.depth):
        base = f"visual.blocks.{i}."
        for hf_name, name in (("norm1", "norm1"), ("norm2", "norm2")):
            yield base + hf_name + ".weight", ("visual", "blocks", name, "scale"), i, "copy"
            yield base + hf_name + ".bias", ("visual", "blocks", name, "bias"), i, "copy"
        for hf_name, name in (("attn.qkv", "qkv"), ("attn.proj", "proj"), ("mlp.linear_fc1", "fc1"),
                              ("mlp.linear_fc2", "fc2")):
            yield base + hf_name + ".weight", ("visual", "blocks", name, "kernel"), i, "linear"
            yield base + hf_name + ".bias", ("visual", "blocks", name, "bias"), i, "copy"
    mergers = [("visual.merger.", ("visual", "merger"), None)]
    mergers += [(f"visual.deepstack_merger_list.{k}.", ("visual", "deepstack"), k)
                for k in range(len(cfg.vision.deepstack_visual_indexes))]
    for base, path, index in mergers:
        yield base + "norm.weight", path + ("norm", "scale"), index, "copy"
        yield base + "norm.bias", path + ("norm", "bias"), index, "copy"
        for hf_name, name in (("linear_fc1", "fc1"), ("linear_fc2", "fc2")):
            yield base + hf_name + ".weight", path + (name, "kernel"), index, "linear"
            yield base + hf_name + ".bias", path + (name, "bias"), index, "copy"
    yield "language_model.embed_tokens.weight", ("text", "embed"), None, "copy"
    for i in range(cfg.text.num_hidden_layers):
        base = f"language_model.layers.{i}."
        layer = ("text", "layers")
        yield base + "input_layernorm.weight", layer + ("input_norm", "scale"), i, "copy"
        yield base + "post_attention_layernorm.weight", layer + ("post_norm", "scale"), i, "copy"
        for proj in "qkvo":
            yield base + f"self_attn.{proj}_proj.weight", layer + (proj, "kernel"), i, "linear"
        yield base + "self_attn.q_norm.weight", layer + ("q_norm", "scale"), i, "copy"
        yield base + "self_attn.k_norm.weight", layer + ("k_norm", "scale"), i, "copy"
        for proj in ("gate", "up", "down"):
            yield base + f"mlp.{proj}_proj.weight", layer + (proj, "kernel"), i, "linear"
    yield "language_model.norm.weight", ("text", "norm", "scale"), None, "copy"
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", ("lm_head", "kernel"), None, "linear"


def _family(cfg: Any) -> Any:
    from vlmgym.models.family import family_of

    return family_of(cfg)


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        tree = tree[name]
    return tree


def _hf_shape(shape: tuple[int, ...], kind: str, cfg: Qwen3VLConfig) -> tuple[int, ...]:
    if kind == "linear":
        return (shape[1], shape[0])
    if kind == "patch":
        v = cfg.vision
        return (shape[1], v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    return shape


def _strip(key: str) -> str:
    return key[len("model."):] if key.startswith("model.") else key


def hf_to_params(state: dict[str, np.ndarray], cfg: Qwen3VLConfig, *,
                 key_table: Callable[[Any], Iterator] | None = None, abstract: Params | None = None) -> Params:
    """Params tree (numpy, checkpoint dtype) from an HF state dict; strict about keys and shapes.

    `key_table` / `abstract` default to Qwen3-VL's; another family (qwen2_5_vl) passes its own.
    """
    bare = {}
    for key, value in state.items():
        name = _strip(key)
        if name in bare:
            raise ConversionError(f"key {key!r} appears twice (with and without the 'model.' prefix)")
        bare[name] = value
    abstract = abstract_params(cfg) if abstract is None else abstract
    table = list((key_table or _key_table)(cfg))
    expected = {hf for hf, *_ in table}
    # Some exports write the tied head too; accept it only when it really equals the embedding.
    if cfg.tie_word_embeddings and "lm_head.weight" in bare and not np.array_equal(
            bare.pop("lm_head.weight"), bare.get("language_model.embed_tokens.weight")):
        raise ConversionError("key 'lm_head.weight': present and different from the embedding, but the config "
                                  "says tie_word_embeddings=true")
    unknown = sorted(set(bare) - expected)
    if unknown:
        raise ConversionError(f"unexpected key {unknown[0]!r} in checkpoint ({len(unknown)} unmatched in all)")
    stacked: dict[tuple[str, ...], list[Any]] = {}
    out: dict[tuple[str, ...], np.ndarray] = {}
    for hf, path, index, kind in table:
        if hf not in bare:
            raise ConversionError(f"missing key {hf!r} in checkpoint")
        target = _get(abstract, path).shape
        per_item = target[1:] if index is not None else target
        want = _hf_shape(per_item, kind, cfg)
        value = np.asarray(bare[hf])
        if tuple(value.shape) != tuple(want):
            raise ConversionError(f"key {hf!r}: shape {tuple(value.shape)} != expected {tuple(want)}")
        if kind == "linear":
            value = value.T
        elif kind == "patch":
            value = value.reshape(value.shape[0], -1).T
        if index is None:
            out[path] = np.ascontiguousarray(value)
        else:
            stacked.setdefault(path, [None] * target[0])[index] = value
    for path, items in stacked.items():
        out[path] = np.stack(items)
    dtypes = {a.dtype for a in out.values()}
    if len(dtypes) != 1:
        raise ConversionError(f"checkpoint mixes dtypes {sorted(str(d) for d in dtypes)}")
    params: Params = {}
    for path, value in out.items():
        node = params
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = value
    return params


def params_to_hf(params: Params, cfg: Qwen3VLConfig, *,
                 key_table: Callable[[Any], Iterator] | None = None) -> dict[str, np.ndarray]:
    """HF state dict ('model.'-prefixed keys, (out, in) linear weights) from a params tree."""
    state = {}
    v = cfg.vision
    for hf, path, index, kind in (key_table or _key_table)(cfg):
        value = np.asarray(_get(params, path))
        if index is not None:
            value = value[index]
        if kind == "linear":
            value = value.T
        elif kind == "patch":
            value = value.T.reshape(-1, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
        key = hf if hf == "lm_head.weight" else "model." + hf
        state[key] = np.ascontiguousarray(value)
    return state


def read_safetensors(folder: str | Path) -> dict[str, np.ndarray]:
    """All tensors of a folder: sharded (model.safetensors.index.json) or single-file safetensors."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise ConversionError(f"{folder}: no safetensors files")
    state: dict[str, np.ndarray] = {}
    for name in files:
        with safe_open(str(folder / name), framework="numpy") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open handles are not iterable)
                if key in state:
                    raise ConversionError(f"key {key!r} is in more than one safetensors file")
                state[key] = f.get_tensor(key)
    return state


def _dtype_name(params: Params) -> str:
    dtype = jax.tree.leaves(params)[0].dtype
    return {np.dtype(np.float32): "fp32", np.dtype(ml_dtypes.bfloat16): "bf16"}[np.dtype(dtype)]


def copy_side_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy tokenizer / preprocessor / chat-template / generation files present in `src`."""
    copied = []
    for name in SIDE_FILES:
        if (Path(src) / name).exists():
            shutil.copy2(Path(src) / name, Path(dst) / name)
            copied.append(name)
    return copied


def to_hf_dict(cfg: Qwen3VLConfig) -> dict[str, Any]:
    """An HF config.json dict (5.x layout) describing `cfg`."""
    t, v = cfg.text, cfg.vision
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "tie_word_embeddings": cfg.tie_word_embeddings, "image_token_id": cfg.image_token_id,
        "video_token_id": cfg.video_token_id, "vision_start_token_id": cfg.vision_start_token_id,
        "vision_end_token_id": cfg.vision_end_token_id,
        "text_config": {
            "model_type": "qwen3_vl_text", "vocab_size": t.vocab_size, "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size, "num_hidden_layers": t.num_hidden_layers,
            "num_attention_heads": t.num_attention_heads, "num_key_value_heads": t.num_key_value_heads,
            "head_dim": t.head_dim, "rms_norm_eps": t.rms_norm_eps, "hidden_act": t.hidden_act,
            "max_position_embeddings": t.max_position_embeddings, "tie_word_embeddings": cfg.tie_word_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": t.rope_theta,
                                "mrope_section": list(t.mrope_section), "mrope_interleaved": True},
        },
        "vision_config": {
            "model_type": "qwen3_vl_vision", "depth": v.depth, "hidden_size": v.hidden_size,
            "intermediate_size": v.intermediate_size, "num_heads": v.num_heads, "out_hidden_size": v.out_hidden_size,
            "deepstack_visual_indexes": list(v.deepstack_visual_indexes), "in_channels": v.in_channels,
            "patch_size": v.patch_size, "temporal_patch_size": v.temporal_patch_size,
            "spatial_merge_size": v.spatial_merge_size, "num_position_embeddings": v.num_position_embeddings,
            "hidden_act": v.hidden_act,
        },
    }


@contextlib.contextmanager
def _without_ocdbt_merge_warning(folder: Path) -> Iterator[None]:
    """Drop orbax's absl warning "Skipping merge of OCDBT checkpoints: No per-process OCDBT checkpoint subdirs
    found in <folder>..." for saves under `folder`, while the block runs.

    Orbax tries to merge per-process OCDBT stores after every pytree save, even one written without OCDBT
    (use_ocdbt=False, as save_checkpoint does), and warns when it finds none: there is nothing to merge, the
    checkpoint is complete. Any other record, and this one for any other folder, is kept."""
    def keep(record):
        message = record.getMessage()
        return not ("Skipping merge of OCDBT checkpoints" in message and str(folder) in message)

    logger = logging.getLogger("absl")  # absl.logging's own logger, read without importing absl
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def save_checkpoint(path: str | Path, cfg: Qwen3VLConfig, params: Params, hf_config: dict[str, Any] | None = None,
                    side_files_from: str | Path | None = None,
                    extra: Callable[[Path], None] | None = None) -> Path:
    """Write params (orbax) + config.json (+ tokenizer files) into `path` atomically (temp dir + rename).

    The folder's bytes depend only on what is saved, so DVC sees equal params as an unchanged output: orbax's
    OCDBT store names its files at random, so arrays are written one zarr folder each instead, and orbax's two
    run records (timestamps, the temp path), which restoring does not read, are dropped.
    """
    final = Path(path).absolute()
    # Params spread over several processes are saved by all of them together, into one shared folder.
    with (distributed.shared_dir(final) if distributed.count() > 1 else atomic_dir(final)) as tmp:
        checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler(use_ocdbt=False))
        with _without_ocdbt_merge_warning(tmp / "params"):
            checkpointer.save(tmp / "params", args=ocp.args.StandardSave(params))  # synchronous
        if distributed.is_primary():  # the small files once
            for record in ("_CHECKPOINT_METADATA", "commit_success.txt"):
                (tmp / "params" / record).unlink(missing_ok=True)
            config = hf_config if hf_config is not None else _family(cfg).to_hf_dict(cfg)
            (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            (tmp / META_FILE).write_text(json.dumps({"param_dtype": _dtype_name(params), "format": 1}) + "\n")
            if side_files_from is not None:
                copy_side_files(side_files_from, tmp)
            if extra is not None:  # more files in the same atomic folder (a LoRA run's adapter/)
                extra(tmp)
    return final


def load_checkpoint(path: str | Path, dtype: str = "fp32", param_dtype: str | None = None,
                    shardings: Any = None) -> tuple[Qwen3VLConfig, Params]:
    """(cfg, params) from a checkpoint folder; params in the stored dtype unless `param_dtype` is given.

    `shardings`: optional tree of jax.sharding.Sharding (see sharding.param_shardings) to restore onto.
    """
    path = Path(path).absolute()
    meta_path = path / META_FILE
    if not meta_path.exists():
        raise ConversionError(f"{path}: not a vlmgym JAX checkpoint ({META_FILE} missing)")
    stored = json.loads(meta_path.read_text())["param_dtype"]
    from vlmgym.models.family import load_config

    cfg = load_config(path, dtype=dtype, param_dtype=param_dtype or stored)
    abstract = _family(cfg).abstract_params(cfg)
    if shardings is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: device, abstract)
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    params = ocp.StandardCheckpointer().restore(path / "params", target)
    return cfg, params


def convert_hf_to_jax(hf_dir: str | Path, out_dir: str | Path) -> tuple[Qwen3VLConfig, Path]:
    """HF folder -> JAX checkpoint folder (params, config.json, tokenizer and preprocessor files)."""
    from vlmgym.models.family import load_config

    hf_dir = Path(hf_dir)
    hf_config = json.loads((hf_dir / "config.json").read_text())
    cfg = load_config(hf_dir)
    params = _family(cfg).hf_to_params(read_safetensors(hf_dir), cfg)
    cfg = cfg.with_dtypes(param_dtype=_dtype_name(params))
    return cfg, save_checkpoint(out_dir, cfg, params, hf_config=hf_config, side_files_from=hf_dir)


def _write_safetensors(state: dict[str, np.ndarray], folder: Path) -> None:
    """One model.safetensors, or shards + model.safetensors.index.json past MAX_SHARD_BYTES."""
    total = sum(a.nbytes for a in state.values())
    if total <= MAX_SHARD_BYTES:
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for key, value in state.items():
        if size and size + value.nbytes > MAX_SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][key] = value
        size += value.nbytes
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def export_to_hf(jax_dir: str | Path, out_dir: str | Path) -> Path:
    """JAX checkpoint folder -> folder that transformers' from_pretrained loads (atomic)."""
    jax_dir = Path(jax_dir)
    cfg, params = load_checkpoint(jax_dir)
    state = _family(cfg).params_to_hf(jax.tree.map(np.asarray, params), cfg)
    final = Path(out_dir).absolute()
    with atomic_dir(final) as tmp:
        _write_safetensors(state, tmp)
        shutil.copy2(jax_dir / "config.json", tmp / "config.json")
        copy_side_files(jax_dir, tmp)
        if (jax_dir / ADAPTER_DIR).is_dir():  # a LoRA run's adapters (PEFT layout) go along
            shutil.copytree(jax_dir / ADAPTER_DIR, tmp / ADAPTER_DIR)
    return final


def check_adapter(hf_dir: str | Path, state: dict[str, np.ndarray]) -> int:
    """Check a LoRA run's `adapter/` folder against PEFT's layout over the exported model's weights `state`, named as
    transformers holds them in memory:
    every lora_A (r, in) / lora_B (out, r) pair sits on a linear layer of that shape that the config's
    target_modules regex names. Returns the number of adapted modules; raises ExportCheckFailed."""
    folder = Path(hf_dir) / ADAPTER_DIR
    config = json.loads((folder / "adapter_config.json").read_text())
    adapters = read_safetensors(folder)
    rank, pattern = config["r"], config["target_modules"]
    prefix = "base_model.model."
    modules = sorted({key[len(prefix):].rsplit(".lora_", 1)[0] for key in adapters})
    if config.get("peft_type") != "LORA" or len(adapters) != 2 * len(modules) or not modules:
        raise ExportCheckFailed(f"{folder}: not a PEFT LoRA adapter ({len(adapters)} tensors, {len(modules)} modules)")
    for module in modules:
        weight = state.get(module + ".weight")
        a, b = adapters.get(f"{prefix}{module}.lora_A.weight"), adapters.get(f"{prefix}{module}.lora_B.weight")
        if weight is None or a is None or b is None or not re.fullmatch(pattern, module):
            raise ExportCheckFailed(f"{folder}: adapter on {module!r} names no adapted linear layer of the model")
        if a.shape != (rank, weight.shape[1]) or b.shape != (weight.shape[0], rank):
            raise ExportCheckFailed(f"{folder}: {module} adapter shapes {a.shape}, {b.shape} do not fit "
                                    f"weight {weight.shape} at rank {rank}")
    return len(modules)


def check_export(jax_dir: str | Path, hf_dir: str | Path) -> dict[str, float]:
    """Compare the exported tensors with the JAX params and load the folder in transformers; returns figures.

    Raises ExportCheckFailed when a tensor is missing, extra or not bit-identical, or when transformers reports
    missing, unexpected or mismatched weights.
    """
    from vlmgym.models.qwen3_vl.hf_reference import IncompleteCheckpoint, load_hf_model

    cfg, params = load_checkpoint(jax_dir)
    family = _family(cfg)
    numpy_params = jax.tree.map(np.asarray, params)
    expected = family.params_to_hf(numpy_params, cfg)
    exported = read_safetensors(hf_dir)
    if expected.keys() != exported.keys():
        missing, extra = sorted(expected.keys() - exported.keys()), sorted(exported.keys() - expected.keys())
        raise ExportCheckFailed(f"{hf_dir}: tensors missing {missing[:5]}, unexpected {extra[:5]}")
    for key, value in expected.items():
        if exported[key].dtype != value.dtype or not np.array_equal(exported[key], value):
            raise ExportCheckFailed(f"{hf_dir}: tensor {key!r} differs from the JAX parameter it was exported from")
    try:
        model = load_hf_model(hf_dir, dtype=None, strict=True)
    except IncompleteCheckpoint as err:
        raise ExportCheckFailed(str(err)) from err
    adapted = (Path(hf_dir) / ADAPTER_DIR).is_dir()
    # PEFT names modules as the model holds them in memory (`model.language_model.*`), which is not always the
    # layout save_pretrained writes (Qwen2.5-VL's hub layout says `model.*`)
    in_memory = params_to_hf(numpy_params, cfg, key_table=family.key_table) if adapted else {}
    figures = {"adapted_modules": float(check_adapter(hf_dir, in_memory))} if adapted else {}
    return {**figures, "tensors": float(len(exported)),
            "parameters": float(sum(int(np.prod(v.shape)) for v in exported.values())),
            "transformers_parameters": float(sum(p.numel() for p in model.parameters())),
            "bytes": float(sum(p.stat().st_size for p in Path(hf_dir).glob("*.safetensors")))}


def export_and_check(jax_dir: str | Path, out_dir: str | Path) -> tuple[Path, dict[str, float]]:
    """`export_to_hf`, then `check_export`; when the check fails (or errors) the exported folder is removed."""
    out = export_to_hf(jax_dir, out_dir)
    try:
        return out, check_export(jax_dir, out)
    except Exception:
        shutil.rmtree(out, ignore_errors=True)
        raise

