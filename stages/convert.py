"""convert stage: HF checkpoint (models/hf/base/) -> JAX checkpoint (models/jax/base/), then a parity check.

Converts the safetensors into an orbax checkpoint with config.json and the tokenizer /
preprocessor files, then runs transformers and the JAX port on a text-only prompt and a
one-image prompt and logs the logit differences to MLflow. Beyond `model.parity_tolerance`
the stage fails and removes its output.

    python stages/convert.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import sys

from vlmgym.models.qwen3_vl.parity import ParityFailure, convert_and_check
from vlmgym.params import load_section
from vlmgym.runtime.collector import collect_less
from vlmgym.tracking import stage_runs as tracking


def main(argv: list[str] | None = None) -> int:
    """Convert, check parity, log one MLflow run; exit 1 (and remove the output) beyond tolerance."""
    collect_less()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (section `model`)")
    args = parser.parse_args(argv)
    params = load_section("model", args.params)
    try:
        # One MLflow run, marked failed when parity fails (the figures are logged first).
        with tracking.stage_run("convert", params, params_file=args.params) as run:
            result = convert_and_check(params.hf_dir, params.jax_dir, dtype=params.dtype,
                                       tolerance=params.parity_tolerance)
            run.log_metrics(result.metrics)
            run.log_dict(result.report, "parity.json")
            result.raise_if_failed()
    except ParityFailure as err:
        print(f"convert: parity FAILED: {err}", file=sys.stderr)
        return 1
    print(f"convert: {params.hf_dir} -> {params.jax_dir} ({result.metrics['params_total']} parameters, "
          f"max abs logit diff {result.report['max_abs_logit_diff']:.3g}, {params.dtype})")
    return 0


if __name__ == "__main__":
    from vlmgym.runtime.errors import guarded

    sys.exit(guarded("convert", main))
