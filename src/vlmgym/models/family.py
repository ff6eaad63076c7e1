"""Which model family a checkpoint is, from its config.json (`model_type`, else `architectures`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN3_VL, QWEN2_5_VL = "qwen3_vl", "qwen2_5_vl"
_ARCHITECTURES = {"Qwen3VLForConditionalGeneration": QWEN3_VL, "Qwen2_5_VLForConditionalGeneration": QWEN2_5_VL}


def model_family(hf_config: dict[str, Any]) -> str:
    """'qwen3_vl' or 'qwen2_5_vl'; ValueError naming what the config says otherwise."""
    model_type = hf_config.get("model_type")
    if model_type in (QWEN3_VL, QWEN2_5_VL):
        return model_type
    for name in hf_config.get("architectures") or ():
        if name in _ARCHITECTURES:
            return _ARCHITECTURES[name]
    raise ValueError(f"config.json: model_type {model_type!r} / architectures {hf_config.get('architectures')!r} "
                     f"is not a supported family ({QWEN3_VL}, {QWEN2_5_VL})")


def load_config(path: str | Path, dtype: str = "fp32", param_dtype: str = "fp32") -> Any:
    """The family's frozen config from config.json (a file or its folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    hf = json.loads(path.read_text())
    family = model_family(hf)
    if family == QWEN2_5_VL:
        from vlmgym.models.qwen2_5_vl.config import from_hf_dict
    else:
        from vlmgym.models.qwen3_vl.config import from_hf_dict
    return from_hf_dict({**hf, "model_type": family}, dtype, param_dtype)
