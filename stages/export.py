"""export stage: the GRPO policy's JAX folder (models/jax/grpo/) -> a transformers folder (models/hf/grpo/).

Writes safetensors + config + tokenizer/preprocessor files with the model-core exporter, then checks the result:
every exported tensor equals the JAX parameter it came from bit for bit, and transformers loads the folder
offline with no missing or unexpected weights. A failed check removes the folder and exits 1.

    python stages/export.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import jax
import numpy as np

from vlmgym import tracking
from vlmgym.models.qwen3_vl.convert import export_to_hf, load_checkpoint, params_to_hf, read_safetensors
from vlmgym.params import load_section


class ExportCheckFailed(RuntimeError):
    """The exported folder does not reproduce the JAX weights or does not load in transformers."""


def check_export(jax_dir: str | Path, hf_dir: str | Path) -> dict[str, float]:
    """Compare the exported tensors with the JAX params and load the folder in transformers; returns figures."""
    from transformers import Qwen3VLForConditionalGeneration

    cfg, params = load_checkpoint(jax_dir)
    expected = params_to_hf(jax.tree.map(np.asarray, params), cfg)
    exported = read_safetensors(hf_dir)
    if expected.keys() != exported.keys():
        missing, extra = sorted(expected.keys() - exported.keys()), sorted(exported.keys() - expected.keys())
        raise ExportCheckFailed(f"{hf_dir}: tensors missing {missing[:5]}, unexpected {extra[:5]}")
    for key, value in expected.items():
        if exported[key].dtype != value.dtype or not np.array_equal(exported[key], value):
            raise ExportCheckFailed(f"{hf_dir}: tensor {key!r} differs from the JAX parameter it was exported from")
    model, info = Qwen3VLForConditionalGeneration.from_pretrained(str(hf_dir), local_files_only=True,
                                                                  output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if problems:
        raise ExportCheckFailed(f"{hf_dir}: transformers reports {problems}")
    return {"tensors": float(len(exported)),
            "parameters": float(sum(int(np.prod(v.shape)) for v in exported.values())),
            "transformers_parameters": float(sum(p.numel() for p in model.parameters())),
            "bytes": float(sum(p.stat().st_size for p in Path(hf_dir).glob("*.safetensors")))}


def main(argv: list[str] | None = None) -> int:
    """Export, check, log one MLflow run; exit 1 (and remove the folder) when the check fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (section export)")
    args = parser.parse_args(argv)
    export = load_section("export", args.params)
    try:
        with tracking.stage_run("export", export, params_file=args.params) as run:
            out = export_to_hf(export.jax_dir, export.hf_dir)
            try:
                figures = check_export(export.jax_dir, out)
            except Exception:
                shutil.rmtree(out, ignore_errors=True)
                raise
            run.log_metrics(figures)
    except ExportCheckFailed as err:
        print(f"export: check FAILED: {err}", file=sys.stderr)
        return 1
    print(f"export: {export.jax_dir} -> {out} ({figures['parameters']:.0f} parameters in "
          f"{figures['tensors']:.0f} tensors, identical to the JAX weights; loads in transformers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
