"""Frozen Qwen2.5-VL configuration read from a Hugging Face `config.json` (4.x flat and 5.x nested layouts).

The text decoder reuses Qwen3-VL's `TextConfig` (chunked MRoPE: `mrope_interleaved=False`), so the Qwen3-VL
decoder code (`vlmgym.models.qwen3_vl.model`) runs Qwen2.5-VL unchanged; only the vision tower differs.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmgym.models.qwen3_vl.config import DTYPES, ConfigError, TextConfig, _need, _rope, _short

MODEL_TYPE = "qwen2_5_vl"
ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"
# Text keys that a 4.x config.json writes at the top level (5.x nests them under text_config).
_TEXT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
              "max_position_embeddings", "hidden_act", "tie_word_embeddings", "use_sliding_window")


@dataclass(frozen=True)
class VisionConfig:
    """The Qwen2.5-VL ViT: window attention with full-attention blocks, 2-D rotary, RMSNorm, SwiGLU, 2x2 merger."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    fullatt_block_indexes: tuple[int, ...]
    window_size: int = 112
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    tokens_per_second: int = 4

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
    def window_merged(self) -> int:
        """Side of an attention window in merged (2x2) units, as transformers computes it."""
        return self.window_size // self.spatial_merge_size // self.patch_size


@dataclass(frozen=True)
class Qwen25VLConfig:
    """Whole-model config plus compute / parameter dtypes (hashable: a jit static arg).

    Field names match `Qwen3VLConfig` where the meaning is the same, so the shared decoder code reads both.
    """

    text: TextConfig
    vision: VisionConfig
    tie_word_embeddings: bool = False
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    dtype: str = "fp32"
    param_dtype: str = "fp32"
    family: str = MODEL_TYPE

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def params_dtype(self) -> Any:
        return DTYPES[self.param_dtype]

    def with_dtypes(self, dtype: str | None = None, param_dtype: str | None = None) -> Qwen25VLConfig:
        """A copy with other compute / parameter dtypes ('fp32' or 'bf16')."""
        for value in (dtype, param_dtype):
            if value is not None and value not in DTYPES:
                raise ConfigError(f"unknown dtype {value!r} (known: fp32, bf16)")
        return dataclasses.replace(self, dtype=_short(dtype or self.dtype),
                                   param_dtype=_short(param_dtype or self.param_dtype))


def _text_section(hf: dict[str, Any]) -> dict[str, Any]:
    """The text keys: 5.x `text_config`, with 4.x top-level keys filling what it lacks."""
    section = {k: hf[k] for k in _TEXT_KEYS if k in hf}
    section.update(hf.get("text_config") or {})
    return section


def from_hf_dict(hf: dict[str, Any], dtype: str = "fp32", param_dtype: str = "fp32") -> Qwen25VLConfig:
    """Build the config from a parsed HF Qwen2.5-VL config.json."""
    if hf.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        raise ConfigError(f"config.model_type: expected {MODEL_TYPE!r}, got {hf.get('model_type')!r}")
    t = _text_section(hf)
    for key in ("rope_parameters", "rope_scaling"):  # 4.x hub configs say {"type": "mrope"}: default rope + sections
        if isinstance(t.get(key), dict) and t[key].get("rope_type", t[key].get("type")) == "mrope":
            t[key] = {k: v for k, v in t[key].items() if k != "type"} | {"rope_type": "default"}
    v = _need(hf, "vision_config", "config")
    if t.get("use_sliding_window"):
        raise ConfigError("text_config.use_sliding_window: true is not supported")
    theta, rope = _rope(t, "text_config", 1_000_000.0)
    heads = _need(t, "num_attention_heads", "text_config")
    hidden = _need(t, "hidden_size", "text_config")
    if hidden % heads:
        raise ConfigError(f"text_config.hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    head_dim = hidden // heads  # Qwen2.5-VL ignores any head_dim key
    section = tuple(rope.get("mrope_section", (16, 24, 24)))
    if sum(section) != head_dim // 2:
        raise ConfigError(f"text_config.rope_parameters.mrope_section {list(section)} must sum to head_dim/2 "
                          f"= {head_dim // 2}")
    text = TextConfig(
        vocab_size=_need(t, "vocab_size", "text_config"),
        hidden_size=hidden,
        intermediate_size=_need(t, "intermediate_size", "text_config"),
        num_hidden_layers=_need(t, "num_hidden_layers", "text_config"),
        num_attention_heads=heads,
        num_key_value_heads=t.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-5)),  # transformers' default
        rope_theta=theta,
        mrope_section=section,
        max_position_embeddings=t.get("max_position_embeddings", 32768),
        hidden_act=t.get("hidden_act", "silu"),
        mrope_interleaved=False,
    )
    vision_theta, _ = _rope(v, "vision_config", 10000.0)
    vision = VisionConfig(
        depth=_need(v, "depth", "vision_config"),
        hidden_size=_need(v, "hidden_size", "vision_config"),
        intermediate_size=_need(v, "intermediate_size", "vision_config"),
        num_heads=_need(v, "num_heads", "vision_config"),
        out_hidden_size=_need(v, "out_hidden_size", "vision_config"),
        fullatt_block_indexes=tuple(v.get("fullatt_block_indexes", (7, 15, 23, 31))),
        window_size=v.get("window_size", 112),
        in_channels=v.get("in_channels", v.get("in_chans", 3)),
        patch_size=v.get("patch_size", v.get("spatial_patch_size", 14)),
        temporal_patch_size=v.get("temporal_patch_size", 2),
        spatial_merge_size=v.get("spatial_merge_size", 2),
        hidden_act=v.get("hidden_act", "silu"),
        rope_theta=vision_theta,
        tokens_per_second=v.get("tokens_per_second", 4),
    )
    if vision.out_hidden_size != text.hidden_size:
        raise ConfigError(f"vision_config.out_hidden_size {vision.out_hidden_size} != text hidden_size "
                          f"{text.hidden_size}")
    if vision.window_merged < 1:
        raise ConfigError(f"vision_config.window_size {vision.window_size} is smaller than one merged patch "
                          f"({vision.patch_size * vision.spatial_merge_size} pixels)")
    cfg = Qwen25VLConfig(
        text=text, vision=vision,
        # transformers ties when either the top-level or the text flag says so (Qwen2_5_VLConfig.__post_init__).
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False) or t.get("tie_word_embeddings", False)),
        image_token_id=hf.get("image_token_id", 151655),
        video_token_id=hf.get("video_token_id", 151656),
        vision_start_token_id=hf.get("vision_start_token_id", 151652),
        vision_end_token_id=hf.get("vision_end_token_id", 151653),
    )
    return cfg.with_dtypes(dtype, param_dtype)


def to_hf_dict(cfg: Qwen25VLConfig) -> dict[str, Any]:
    """An HF config.json dict (5.x nested layout) describing `cfg`."""
    t, v = cfg.text, cfg.vision
    return {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "tie_word_embeddings": cfg.tie_word_embeddings,
        "image_token_id": cfg.image_token_id, "video_token_id": cfg.video_token_id,
        "vision_start_token_id": cfg.vision_start_token_id, "vision_end_token_id": cfg.vision_end_token_id,
        "text_config": {
            "model_type": "qwen2_5_vl_text", "vocab_size": t.vocab_size, "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size, "num_hidden_layers": t.num_hidden_layers,
            "num_attention_heads": t.num_attention_heads, "num_key_value_heads": t.num_key_value_heads,
            "rms_norm_eps": t.rms_norm_eps, "hidden_act": t.hidden_act,
            "max_position_embeddings": t.max_position_embeddings, "tie_word_embeddings": cfg.tie_word_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": t.rope_theta,
                                "mrope_section": list(t.mrope_section)},
        },
        "vision_config": {
            "model_type": "qwen2_5_vl_vision", "depth": v.depth, "hidden_size": v.hidden_size,
            "intermediate_size": v.intermediate_size, "num_heads": v.num_heads, "out_hidden_size": v.out_hidden_size,
            "fullatt_block_indexes": list(v.fullatt_block_indexes), "window_size": v.window_size,
            "in_channels": v.in_channels, "patch_size": v.patch_size, "temporal_patch_size": v.temporal_patch_size,
            "spatial_merge_size": v.spatial_merge_size, "hidden_act": v.hidden_act,
            "tokens_per_second": v.tokens_per_second,
        },
    }


def load_hf_config(path: str | Path, dtype: str = "fp32", param_dtype: str = "fp32") -> Qwen25VLConfig:
    """Read config.json (a file or its folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    return from_hf_dict(json.loads(path.read_text()), dtype, param_dtype)


CONFIGS_DIR = Path(__file__).parent / "configs"


def named_config(name: str, dtype: str = "fp32", param_dtype: str = "fp32") -> Qwen25VLConfig:
    """One of the shipped hub configs: '3b' (tied embeddings) or '7b'."""
    path = CONFIGS_DIR / f"qwen2_5_vl_{name.lower()}.json"
    if not path.exists():
        known = sorted(p.stem.removeprefix("qwen2_5_vl_") for p in CONFIGS_DIR.glob("*.json"))
        raise ConfigError(f"unknown config {name!r} (known: {known})")
    return load_hf_config(path, dtype, param_dtype)
