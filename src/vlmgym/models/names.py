"""Which model family a checkpoint is, from its config.json (`model_type`, else `architectures`), without importing
any model code: what the light stages (base_model) ask; vlmgym.models.family holds what each family brings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN3_VL, QWEN2_5_VL = "qwen3_vl", "qwen2_5_vl"
FAMILIES = (QWEN3_VL, QWEN2_5_VL)
ARCHITECTURES = {"Qwen3VLForConditionalGeneration": QWEN3_VL, "Qwen2_5_VLForConditionalGeneration": QWEN2_5_VL}


def model_family(hf_config: dict[str, Any]) -> str:
    """'qwen3_vl' or 'qwen2_5_vl'; ValueError naming what the config says otherwise."""
    model_type = hf_config.get("model_type")
    if model_type in FAMILIES:
        return model_type
    for name in hf_config.get("architectures") or ():
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    raise ValueError(f"config.json: model_type {model_type!r} / architectures {hf_config.get('architectures')!r} "
                     f"is not a supported family ({QWEN3_VL}, {QWEN2_5_VL})")


def config_path(path: str | Path) -> Path:
    """config.json of a checkpoint folder (or the file itself)."""
    path = Path(path)
    return path / "config.json" if path.is_dir() else path


def folder_family(path: str | Path) -> str:
    """The family of a checkpoint folder (or config.json file); ValueError naming the file otherwise."""
    config = config_path(path)
    try:
        hf = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{config}: cannot read the model config ({err})") from err
    try:
        return model_family(hf)
    except ValueError as err:
        raise ValueError(f"{config}: {err}") from err
