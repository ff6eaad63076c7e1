"""Checkpoint folders of every model family: orbax params + config.json (save / load), a transformers folder
converted in, and the export back to one that transformers loads, checked bit-exact.

The family comes from the config (`cfg.family`) or the folder's config.json (vlmgym.models.family), which brings
its key table and parameter layout.
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
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp

from vlmgym.models.family import family_of, load_config
from vlmgym.models.qwen3_vl.convert import ConversionError, params_to_hf, read_safetensors, write_safetensors
from vlmgym.models.qwen3_vl.hf_reference import IncompleteCheckpoint, load_hf_model
from vlmgym.models.qwen3_vl.lora import ADAPTER_DIR
from vlmgym.models.qwen3_vl.weights import Params
from vlmgym.runtime import distributed
from vlmgym.runtime.atomic import atomic_dir

# Files next to the weights that a transformers folder needs besides config + safetensors.
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
              "added_tokens.json", "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
              "video_preprocessor_config.json", "processor_config.json", "generation_config.json")
META_FILE = "vlmgym_checkpoint.json"


class ExportCheckFailed(RuntimeError):
    """The exported folder does not reproduce the JAX weights or does not load in transformers."""



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



def save_checkpoint(path: str | Path, cfg: Any, params: Params, hf_config: dict[str, Any] | None = None,
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
            config = hf_config if hf_config is not None else family_of(cfg).to_hf_dict(cfg)
            (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            (tmp / META_FILE).write_text(json.dumps({"param_dtype": _dtype_name(params), "format": 1}) + "\n")
            if side_files_from is not None:
                copy_side_files(side_files_from, tmp)
            if extra is not None:  # more files in the same atomic folder (a LoRA run's adapter/)
                extra(tmp)
    return final



def load_checkpoint(path: str | Path, dtype: str = "fp32", param_dtype: str | None = None,
                    shardings: Any = None) -> tuple[Any, Params]:
    """(cfg, params) from a checkpoint folder; params in the stored dtype unless `param_dtype` is given.

    `shardings`: optional tree of jax.sharding.Sharding (see sharding.param_shardings) to restore onto.
    """
    path = Path(path).absolute()
    meta_path = path / META_FILE
    if not meta_path.exists():
        raise ConversionError(f"{path}: not a vlmgym JAX checkpoint ({META_FILE} missing)")
    stored = json.loads(meta_path.read_text())["param_dtype"]
    cfg = load_config(path, dtype=dtype, param_dtype=param_dtype or stored)
    abstract = family_of(cfg).abstract_params(cfg)
    if shardings is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: device, abstract)
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    params = ocp.StandardCheckpointer().restore(path / "params", target)
    return cfg, params



def convert_hf_to_jax(hf_dir: str | Path, out_dir: str | Path) -> tuple[Any, Path]:
    """HF folder -> JAX checkpoint folder (params, config.json, tokenizer and preprocessor files)."""
    hf_dir = Path(hf_dir)
    hf_config = json.loads((hf_dir / "config.json").read_text())
    cfg = load_config(hf_dir)
    params = family_of(cfg).hf_to_params(read_safetensors(hf_dir), cfg)
    cfg = cfg.with_dtypes(param_dtype=_dtype_name(params))
    return cfg, save_checkpoint(out_dir, cfg, params, hf_config=hf_config, side_files_from=hf_dir)



def export_to_hf(jax_dir: str | Path, out_dir: str | Path) -> Path:
    """JAX checkpoint folder -> folder that transformers' from_pretrained loads (atomic)."""
    jax_dir = Path(jax_dir)
    cfg, params = load_checkpoint(jax_dir)
    state = family_of(cfg).params_to_hf(jax.tree.map(np.asarray, params), cfg)
    final = Path(out_dir).absolute()
    with atomic_dir(final) as tmp:
        write_safetensors(state, tmp)
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
    cfg, params = load_checkpoint(jax_dir)
    family = family_of(cfg)
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

