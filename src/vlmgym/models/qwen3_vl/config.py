"""Frozen Qwen3-VL configuration read from a Hugging Face `config.json` (4.57 and 5.x layouts)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax.numpy as jnp

CONFIGS_DIR = Path(__file__).parent / "configs"
DTYPES = {"fp32": jnp.float32, "float32": jnp.float32, "bf16": jnp.bfloat16, "bfloat16": jnp.bfloat16}


class ConfigError(ValueError):
    """A config.json is not a usable Qwen3-VL config (names the key)."""


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower (ViT with learned + 2-D rotary positions, DeepStack taps, 2x2 merger)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    deepstack_visual_indexes: tuple[int, ...]
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened (C, T, P, P) pixel row."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2

    @property
    def grid_side(self) -> int:
        return int(round(self.num_position_embeddings**0.5))


@dataclass(frozen=True)
class TextConfig:
    """The Qwen3 text decoder."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 5_000_000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    max_position_embeddings: int = 262144
    hidden_act: str = "silu"
    # Qwen3-VL interleaves the t/h/w frequencies; Qwen2(.5)-VL takes them in chunks [t..., h..., w...].
    mrope_interleaved: bool = True


@dataclass(frozen=True)
class Qwen3VLConfig:
    """Whole-model config plus the compute / parameter dtypes used by the JAX port (hashable: a jit static arg)."""

    text: TextConfig
    vision: VisionConfig
    tie_word_embeddings: bool = False
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    dtype: str = "fp32"
    param_dtype: str = "fp32"
    family: str = "qwen3_vl"  # vlmgym.models.family: what code outside the models asks the family record

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def params_dtype(self) -> Any:
        return DTYPES[self.param_dtype]

    def with_dtypes(self, dtype: str | None = None, param_dtype: str | None = None) -> Qwen3VLConfig:
        """A copy with other compute / parameter dtypes ('fp32' or 'bf16')."""
        for value in (dtype, param_dtype):
            if value is not None and value not in DTYPES:
                raise ConfigError(f"unknown dtype {value!r} (known: fp32, bf16)")
        return dataclasses.replace(self, dtype=_short(dtype or self.dtype), param_dtype=_short(param_dtype or
                                                                                            self.param_dtype))


def _short(name: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16"}.get(name, name)


def _rope(section: dict[str, Any], where: str, default_theta: float) -> tuple[float, dict[str, Any]]:
    """Rope theta and parameters from 5.x `rope_parameters` or 4.57 `rope_theta` + `rope_scaling`."""
    params = dict(section.get("rope_parameters") or section.get("rope_scaling") or {})
    theta = params.get("rope_theta", section.get("rope_theta", default_theta))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "axial"):
        raise ConfigError(f"{where}.rope_parameters.rope_type: {rope_type!r} is not supported (only 'default')")
    return float(theta), params


def _need(section: dict[str, Any], key: str, where: str) -> Any:
    if key not in section:
        raise ConfigError(f"{where}.{key}: missing")
    return section[key]


def from_hf_dict(hf: dict[str, Any], dtype: str = "fp32", param_dtype: str = "fp32") -> Qwen3VLConfig:
    """Build the config from a parsed HF Qwen3-VL config.json."""
    if hf.get("model_type", "qwen3_vl") != "qwen3_vl":
        raise ConfigError(f"config.model_type: expected 'qwen3_vl', got {hf.get('model_type')!r}")
    t = _need(hf, "text_config", "config")
    v = _need(hf, "vision_config", "config")
    theta, rope = _rope(t, "text_config", 5_000_000.0)
    head_dim = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    text = TextConfig(
        vocab_size=_need(t, "vocab_size", "text_config"),
        hidden_size=_need(t, "hidden_size", "text_config"),
        intermediate_size=_need(t, "intermediate_size", "text_config"),
        num_hidden_layers=_need(t, "num_hidden_layers", "text_config"),
        num_attention_heads=_need(t, "num_attention_heads", "text_config"),
        num_key_value_heads=t.get("num_key_value_heads") or t["num_attention_heads"],
        head_dim=head_dim,
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        mrope_section=tuple(rope.get("mrope_section", (24, 20, 20))),
        max_position_embeddings=t.get("max_position_embeddings", 262144),
        hidden_act=t.get("hidden_act", "silu"),
    )
    vision_theta, _ = _rope(v, "vision_config", 10000.0)
    vision = VisionConfig(
        depth=_need(v, "depth", "vision_config"),
        hidden_size=_need(v, "hidden_size", "vision_config"),
        intermediate_size=_need(v, "intermediate_size", "vision_config"),
        num_heads=_need(v, "num_heads", "vision_config"),
        out_hidden_size=_need(v, "out_hidden_size", "vision_config"),
        deepstack_visual_indexes=tuple(v.get("deepstack_visual_indexes", (8, 16, 24))),
        in_channels=v.get("in_channels", 3),
        patch_size=v.get("patch_size", 16),
        temporal_patch_size=v.get("temporal_patch_size", 2),
        spatial_merge_size=v.get("spatial_merge_size", 2),
        num_position_embeddings=v.get("num_position_embeddings", 2304),
        hidden_act=v.get("hidden_act", "gelu_pytorch_tanh"),
        rope_theta=vision_theta,
    )
    cfg = Qwen3VLConfig(
        text=text, vision=vision,
        # transformers ties lm_head from the top-level flag only (default False).
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        image_token_id=hf.get("image_token_id", 151655),
        video_token_id=hf.get("video_token_id", 151656),
        vision_start_token_id=hf.get("vision_start_token_id", 151652),
        vision_end_token_id=hf.get("vision_end_token_id", 151653),
    ).with_dtypes(dtype, param_dtype)
    validate(cfg)
    return cfg


def validate(cfg: Qwen3VLConfig) -> None:
    """Raise ConfigError on combinations the architecture cannot run."""
    t, v = cfg.text, cfg.vision
    checks = [
        (sum(t.mrope_section) == t.head_dim // 2, "text_config.mrope_section must sum to head_dim / 2"),
        (t.num_attention_heads % t.num_key_value_heads == 0, "text_config.num_attention_heads % num_key_value_heads"),
        (v.out_hidden_size == t.hidden_size, "vision_config.out_hidden_size must equal text_config.hidden_size"),
        (v.grid_side**2 == v.num_position_embeddings, "vision_config.num_position_embeddings must be a square"),
        (v.hidden_size % v.num_heads == 0 and v.head_dim % 4 == 0, "vision_config head_dim must divide by 4"),
        (all(0 <= i < v.depth for i in v.deepstack_visual_indexes), "vision_config.deepstack_visual_indexes < depth"),
        (len(v.deepstack_visual_indexes) <= t.num_hidden_layers, "more DeepStack taps than text layers"),
        (list(v.deepstack_visual_indexes) == sorted(set(v.deepstack_visual_indexes)),
         "vision_config.deepstack_visual_indexes must be increasing"),
        (t.hidden_act == "silu", "text_config.hidden_act must be 'silu'"),
        (v.hidden_act in ("gelu_pytorch_tanh", "gelu"), "vision_config.hidden_act must be gelu_pytorch_tanh or gelu"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def load_hf_config(path: str | Path, dtype: str = "fp32", param_dtype: str = "fp32") -> Qwen3VLConfig:
    """Read a config.json file (or the one in a folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot read config ({err})") from err
    try:
        return from_hf_dict(raw, dtype, param_dtype)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err


def named_config(name: str, dtype: str = "fp32", param_dtype: str = "fp32") -> Qwen3VLConfig:
    """One of the shipped real configs: '2b', '4b' or '8b'."""
    path = CONFIGS_DIR / f"qwen3_vl_{name.lower()}.json"
    if not path.exists():
        known = sorted(p.stem.removeprefix("qwen3_vl_") for p in CONFIGS_DIR.glob("*.json"))
        raise ConfigError(f"unknown config {name!r} (known: {known})")
    return load_hf_config(path, dtype, param_dtype)
