"""The model families vlmgym runs (Qwen3-VL, Qwen2.5-VL) and what differs between them, in one record.

A checkpoint's config.json names its family (`model_type`, else `architectures`); a loaded config carries it
(`cfg.family`). Code outside `vlmgym.models` asks this module instead of importing a family's modules:

    family = family_of(cfg)                       # or family_named("qwen2_5_vl"), folder_family(path)
    layout = family.patch_layout(cfg, grid_thw, pad_to=None)
    image_embeds, deepstack = family.encode(params, cfg, pixel_values, layout, remat=False)   # deepstack: None
    family.param_axes(cfg), family.abstract_params(cfg)               # sharding, planning
    family.hf_class()                                                  # transformers' model class

The decoder (vlmgym.models.qwen3_vl.model), the checkpoint format and the processor code are shared: each family
only brings its vision tower, parameter layout, key table, image settings and chat template. Checkpoint folders
(vlmgym.models.checkpoint) read the family from the folder's config.json. A family's modules are imported when it
is first asked for, so reading a family's name needs neither jax nor torch; the modules shared by both families
import this one, never the other way.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmgym.models.names import FAMILIES, QWEN2_5_VL, QWEN3_VL, config_path, folder_family, model_family

__all__ = ["FAMILIES", "QWEN2_5_VL", "QWEN3_VL", "Family", "family_named", "family_of", "folder_family",
           "model_family", "load_config", "encode_images"]


def load_config(path: str | Path, dtype: str = "fp32", param_dtype: str = "fp32") -> Any:
    """The family's frozen config from config.json (a file or its folder)."""
    config = config_path(path)
    hf = json.loads(config.read_text())
    family = folder_family(config)
    try:
        return family_named(family).from_hf_dict({**hf, "model_type": family}, dtype, param_dtype)
    except ValueError as err:
        raise type(err)(f"{config}: {err}") from err


@dataclass(frozen=True)
class Family:
    """What one model family brings to the shared decoder, checkpoint format and processor code."""

    name: str  # config.json model_type
    architecture: str  # transformers class name in config.json `architectures`
    from_hf_dict: Callable[..., Any]  # (hf config dict, dtype, param_dtype) -> frozen config
    to_hf_dict: Callable[[Any], dict[str, Any]]  # frozen config -> a config.json dict
    named_config: Callable[..., Any]  # (name like '3b', dtype, param_dtype) -> a shipped hub config
    param_specs: Callable[[Any], Any]
    param_axes: Callable[[Any], Any]  # logical axis names, for vlmgym.models.qwen3_vl.mesh
    abstract_params: Callable[[Any], Any]
    init_params: Callable[..., Any]
    key_table: Callable[[Any], Any]  # (bare HF key, params path, stacked index, kind), in-memory HF names
    hf_to_params: Callable[[dict, Any], Any]  # either HF layout -> params
    params_to_hf: Callable[[Any, Any], dict]  # params -> the layout save_pretrained writes
    patch_layout: Callable[..., dict]  # (cfg, grid_thw, pad_to=None) -> host arrays for `encode`
    encode: Callable[..., tuple[Any, Any]]  # (params, cfg, pixels, layout, remat=False) -> (embeds, deepstack|None)
    # (index, valid, slot) key triples of the attention blocks in a patch layout (the rollout engine pads them)
    layout_blocks: tuple[tuple[str, str, str], ...]
    image_settings: Any  # the hub's ImageSettings (patch size, mean / std, pixel budget)
    chat_template: str  # the hub Instruct model's
    vision_lora: Mapping[str, str]  # vision block projection -> its HF module under visual.blocks.N
    hf_class: Callable[[], type]  # transformers' model class (imports transformers)
    hf_config_class: Callable[[], type]


def family_of(cfg: Any) -> Family:
    """The family of a loaded config (`cfg.family`)."""
    return family_named(getattr(cfg, "family", QWEN3_VL))


@functools.cache
def family_named(name: str) -> Family:
    """The Family record of 'qwen3_vl' or 'qwen2_5_vl'."""
    if name == QWEN3_VL:
        return _qwen3_vl()
    if name == QWEN2_5_VL:
        return _qwen2_5_vl()
    raise ValueError(f"model family {name!r} is not one of {FAMILIES}")


def _qwen3_vl() -> Family:
    from vlmgym.models.qwen3_vl import config, convert, vision, weights
    from vlmgym.models.qwen3_vl.lora import VISION_LORA
    from vlmgym.models.qwen3_vl.processor import QWEN3_VL_CHAT_TEMPLATE, ImageSettings

    def hf_class() -> type:
        from transformers import Qwen3VLForConditionalGeneration
        return Qwen3VLForConditionalGeneration

    def hf_config_class() -> type:
        from transformers import Qwen3VLConfig
        return Qwen3VLConfig

    return Family(
        name=QWEN3_VL, architecture="Qwen3VLForConditionalGeneration", from_hf_dict=config.from_hf_dict,
        to_hf_dict=convert.to_hf_dict, named_config=config.named_config, param_specs=weights.param_specs,
        param_axes=weights.param_axes, abstract_params=weights.abstract_params, init_params=weights.init_params,
        # through the module, so a test that replaces convert.params_to_hf reaches every caller
        key_table=convert._key_table, hf_to_params=lambda state, cfg: convert.hf_to_params(state, cfg),
        params_to_hf=lambda params, cfg: convert.params_to_hf(params, cfg),
        patch_layout=vision.patch_layout, encode=vision.encode_patches,
        layout_blocks=(("block_index", "block_valid", "patch_slot"),), image_settings=ImageSettings(),
        chat_template=QWEN3_VL_CHAT_TEMPLATE, vision_lora=VISION_LORA[QWEN3_VL], hf_class=hf_class,
        hf_config_class=hf_config_class)


def _qwen2_5_vl() -> Family:
    from vlmgym.models.qwen2_5_vl import config, convert, vision, weights
    from vlmgym.models.qwen2_5_vl.processor import CHAT_TEMPLATE, IMAGE_SETTINGS
    from vlmgym.models.qwen3_vl.lora import VISION_LORA

    def encode(params: Any, cfg: Any, pixel_values: Any, layout: dict, remat: bool = False) -> tuple[Any, None]:
        return vision.encode_patches(params, cfg, pixel_values, layout, remat), None  # no DeepStack

    def hf_class() -> type:
        from transformers import Qwen2_5_VLForConditionalGeneration
        return Qwen2_5_VLForConditionalGeneration

    def hf_config_class() -> type:
        from transformers import Qwen2_5_VLConfig
        return Qwen2_5_VLConfig

    return Family(
        name=QWEN2_5_VL, architecture=config.ARCHITECTURE, from_hf_dict=config.from_hf_dict,
        to_hf_dict=config.to_hf_dict, named_config=config.named_config, param_specs=weights.param_specs,
        param_axes=weights.param_axes, abstract_params=weights.abstract_params, init_params=weights.init_params,
        key_table=convert.key_table, hf_to_params=convert.hf_to_params, params_to_hf=convert.params_to_hf,
        patch_layout=vision.patch_layout, encode=encode,
        layout_blocks=(("full_index", "full_valid", "full_slot"), ("window_index", "window_valid", "window_slot")),
        image_settings=IMAGE_SETTINGS, chat_template=CHAT_TEMPLATE, vision_lora=VISION_LORA[QWEN2_5_VL],
        hf_class=hf_class, hf_config_class=hf_config_class)


def encode_images(params: Any, cfg: Any, pixel_values: Any, grid_thw: Any) -> tuple[Any, Any]:
    """Host wrapper of the family's vision tower (jitted): (image embeds, DeepStack embeds or None)."""
    family = family_of(cfg)
    layout = family.patch_layout(cfg, [tuple(int(x) for x in g) for g in grid_thw])
    return _jitted_encode(family.name)(params, cfg, pixel_values, layout)


@functools.cache
def _jitted_encode(name: str) -> Callable[..., tuple[Any, Any]]:
    import jax

    return jax.jit(family_named(name).encode, static_argnums=1)
