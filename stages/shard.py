"""shard stage: validate data/raw/, resize, write webdataset tars to data/shards/{train,test}/ + manifest.json.

A mixture of envs (env.name: mixture) shards each sub-env's data/raw/<name>/ into data/shards/<name>/.

Run: `python stages/shard.py` (dvc repro runs it); ~3 s for the default synthetic data.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from vlmgym import envs
from vlmgym.data.shard_writer import env_schemas, manifest_metrics, shard_envs
from vlmgym.params import DEFAULT_PARAMS_FILE, load_section
from vlmgym.runtime.collector import collect_less
from vlmgym.tracking import stage_runs as tracking


def main(argv: list[str] | None = None) -> int:
    """Read the `shard` section (and env.name / data.raw_dir), shard both splits, log one MLflow run."""
    collect_less()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(DEFAULT_PARAMS_FILE), help="params file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    params = load_section("shard", args.params)
    data = load_section("data", args.params)
    env_params = load_section("env", args.params)
    schemas = env_schemas({name: envs.env_class(name) for name in envs.parts(env_params)})
    extra = {"env.name": envs.env_class(env_params.name).name, "data.raw_dir": data.raw_dir}
    with tracking.stage_run("shard", params, extra_params=extra, params_file=args.params) as run:
        manifest = shard_envs(Path(data.raw_dir), Path(params.out_dir), schemas, params)
        run.log_metrics(manifest_metrics(manifest))
        run.log_artifact(Path(params.out_dir) / "manifest.json")
    print(json.dumps(manifest_metrics(manifest), indent=1))
    return 0


if __name__ == "__main__":
    from vlmgym.runtime.errors import guarded

    sys.exit(guarded("shard", main))
