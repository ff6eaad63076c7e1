"""download stage: build data/raw/, the env's raw layout, for params `data` (its embedded generator by default).

A mixture of envs (env.name: mixture) writes each sub-env's layout into data/raw/<name>/.

Run: `python stages/download.py` (dvc repro runs it); ~10 s for the default 2,000 + 200 synthetic images.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from vlmgym import envs
from vlmgym.data.download import build_raw_envs, numeric_metrics
from vlmgym.params import DEFAULT_PARAMS_FILE, load_section
from vlmgym.runtime.collector import collect_less
from vlmgym.tracking import stage_runs as tracking


def main(argv: list[str] | None = None) -> int:
    """Read the `data` section, write the raw layout atomically and log one MLflow run."""
    collect_less()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(DEFAULT_PARAMS_FILE), help="params file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    params = load_section("data", args.params)
    env_params = load_section("env", args.params)
    with tracking.stage_run("download", params, extra_params={"env.name": env_params.name},
                            params_file=args.params) as run:
        stats = build_raw_envs(params, {name: envs.env_class(name) for name in envs.parts(env_params)})
        run.log_metrics(numeric_metrics(stats))
        run.log_dict(stats, "download_stats.json")
    print(json.dumps({k: v for k, v in stats.items() if k != "details"}, indent=1))
    return 0


if __name__ == "__main__":
    from vlmgym.runtime.errors import guarded

    sys.exit(guarded("download", main))
