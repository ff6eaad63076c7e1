"""rollout stage: each policy (base, sft, grpo) answers the test split -> outputs/rollouts/<policy>.jsonl.

Greedy answers (the headline numbers) with the rollout engine in batches of `rollout.batch_size`, scored by the
env at curriculum progress `rollout.progress`; with `rollout.sampled_answers: k > 0` also k sampled answers per
prompt in <policy>.sampled.jsonl. One record per answer (schema: vlmgym.eval.records and vlmgym.eval.rollouts).
When the shards hold the env's out-of-distribution split (`rollout.ood_split`, test_ood), each policy also answers
it, greedy, into test_ood/<policy>.jsonl. The image-blind baselines (vlmgym.eval.blind) answer the same splits:
each of `rollout.blind_policies` again with its images blanked, as <policy>_blind.jsonl, and with
`rollout.constant_baseline` the best constant answer chosen on the val split, as constant.jsonl. summary.json
holds each policy's counts, mean reward and format rate; a mixture of envs (env.name: mixture) answers each
sub-env's splits into <name>/<policy>.jsonl and <name>/test_ood/<policy>.jsonl, and its summary.json holds
{name: {policy: figures}}. Speeds (seconds, tokens/s) go to the MLflow run only, so the folder is the same bytes
on every run. The folder is replaced as a whole, atomically. The answering is vlmgym.eval.answering's, which
`vlmgym compare` answers its arms with too.

    python stages/rollout.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vlmgym.eval.answering import answer_policies
from vlmgym.params import load_section
from vlmgym.runtime.atomic import atomic_dir
from vlmgym.runtime.collector import collect_less
from vlmgym.tracking import stage_runs as tracking


def main(argv: list[str] | None = None) -> int:
    """Roll out every policy, write the JSONL folder atomically and log one MLflow run."""
    collect_less()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (sections rollout, model, env)")
    args = parser.parse_args(argv)
    rollout = load_section("rollout", args.params)
    model = load_section("model", args.params)
    env_params = load_section("env", args.params)
    if not rollout.policies or len(set(rollout.policies)) != len(rollout.policies):
        print(f"rollout: policies must be distinct and not empty, got {rollout.policies}", file=sys.stderr)
        return 1
    logged = {"model.dtype": model.dtype, "model.param_dtype": model.param_dtype, "env.name": env_params.name}
    with tracking.stage_run("rollout", rollout, extra_params=logged, params_file=args.params) as run:
        with atomic_dir(Path(rollout.out_dir)) as tmp:
            summary = answer_policies(rollout, model, env_params, tmp,
                                      on_answered=lambda answered: run.log_metrics(answered.metrics()))
            (tmp / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        run.log_dict(summary, "rollout_summary.json")
    return 0


if __name__ == "__main__":
    from vlmgym.runtime.errors import guarded

    sys.exit(guarded("rollout", main))
