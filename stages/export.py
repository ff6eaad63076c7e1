"""export stage: the GRPO policy's JAX folder (models/jax/grpo/) -> a transformers folder (models/hf/grpo/).

Writes safetensors + config + tokenizer/preprocessor files with the model-core exporter, then checks the result:
every exported tensor equals the JAX parameter it came from bit for bit, and transformers loads the folder
offline, as its family's class (Qwen3VLForConditionalGeneration or Qwen2_5_VLForConditionalGeneration, from
config.json), with no missing or unexpected weights. A failed check removes the folder and exits 1. Then (with
`export.register`) the folder is logged as an MLflow model and registered as `vlmgym-<env>`
(vlmgym.tracking.model_registry), through the run's spool: with the tracking server down the stage still ends
with its folder written (status 0) and the registration waits in mlflow-spool/ for the next stage or
`vlmgym tracking sync`.

    python stages/export.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import sys

from vlmgym.models.checkpoint import ExportCheckFailed, export_and_check
from vlmgym.params import load_section
from vlmgym.runtime.collector import collect_less
from vlmgym.tracking import model_registry as registry
from vlmgym.tracking import stage_runs as tracking


def main(argv: list[str] | None = None) -> int:
    """Export, check, log one MLflow run; exit 1 (and remove the folder) when the check fails."""
    collect_less()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (section export)")
    args = parser.parse_args(argv)
    export = load_section("export", args.params)
    env_name = load_section("env", args.params).name
    max_new_tokens = load_section("rollout", args.params).max_new_tokens
    logged = {"env.name": env_name, "rollout.max_new_tokens": max_new_tokens}
    try:
        with tracking.stage_run("export", export, extra_params=logged, params_file=args.params) as run:
            out, figures = export_and_check(export.jax_dir, export.hf_dir)
            run.log_metrics(figures)
            if export.register:
                # Through the run's spool: the folder is complete whatever the server does, and a registration
                # the server cannot take now waits for the next stage or `vlmgym tracking sync`.
                run.register_model(out, env_name, max_new_tokens=max_new_tokens)
                if not run.wait_sent():
                    print(f"export: the MLflow server ({run.spool.tracking_uri}) did not take the registration of "
                          f"{out} as {registry.registered_name(env_name)}; it waits in {run.spool.folder}: the "
                          "next stage sends it, or `vlmgym tracking sync`", file=sys.stderr, flush=True)
    except ExportCheckFailed as err:
        print(f"export: check FAILED: {err}", file=sys.stderr)
        return 1
    print(f"export: {export.jax_dir} -> {out} ({figures['parameters']:.0f} parameters in "
          f"{figures['tensors']:.0f} tensors, identical to the JAX weights; loads in transformers)")
    return 0


if __name__ == "__main__":
    from vlmgym.runtime.errors import guarded

    sys.exit(guarded("export", main))
