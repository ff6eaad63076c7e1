"""Printed at the end of `make demo`: the results table and where to look."""

from __future__ import annotations

import json

from vlmgym.params import load_section
from vlmgym.tracking import spool
from vlmgym.tracking.stage_runs import repo_root, tracking_uri

# What RL optimises, per policy: its greedy answer, the mean of its k sampled answers, and the best of them
SHARPENING = (("mean_reward", "greedy"), ("sampled_mean_reward", "k sampled, mean"),
              ("best_of_k_reward", "k sampled, best"))


def sharpening_lines(metrics: dict) -> list[str]:
    """sft and grpo side by side on greedy, sampled-mean and best-of-k reward (test), where eval.json has them."""
    policies = [p for p in ("sft", "grpo") if isinstance(metrics.get(p), dict)]
    rows = [(label, [metrics[p].get(key) for p in policies]) for key, label in SHARPENING]
    rows = [(label, values) for label, values in rows if all(isinstance(v, (int, float)) for v in values)]
    if not policies or not rows:
        return []
    lines = ["\nWhat GRPO changed (mean reward on test; greedy rising toward best-of-k is sampled headroom turned "
             "into greedy answers):", "  " + " " * 18 + "".join(f"{p:>8}" for p in policies)]
    lines += [f"  {label:<18}" + "".join(f"{v:8.3f}" for v in values) for label, values in rows]
    lines.append("  Against more SFT at the same budget, over seeds: vlmgym study new rl-vs-sft --arms sft_longer "
                 "grpo, then dvc repro studies/rl-vs-sft/dvc.yaml (docs/studies.md)")
    return lines


def main() -> int:
    root = repo_root()
    metrics_dir = root / "metrics"
    for path in sorted(metrics_dir.glob("*.json")) if metrics_dir.exists() else []:
        print(f"\n== {path.relative_to(root)} ==")
        table = root / "reports" / f"{path.stem}.md"
        print(table.read_text() if table.exists() else json.dumps(json.loads(path.read_text()), indent=2))
    eval_json = metrics_dir / "eval.json"
    if eval_json.exists():
        print("\n".join(sharpening_lines(json.loads(eval_json.read_text()))))
    uri = tracking_uri()
    print("\nWhere to look:")
    print(f"  MLflow runs:     mlflow ui --backend-store-uri {uri}   (then open http://127.0.0.1:5000)")
    # metrics/eval.json's thousand figures are a DVC output, not its metrics: the headline is what fits a terminal
    print("  DVC metrics:     .venv/bin/dvc metrics show   (the headline, metrics/headline.json; every figure with its "
          "interval: reports/eval.md, metrics/eval.json)")
    print("  DVC pipeline:    .venv/bin/dvc dag")
    for report in sorted((root / "reports").glob("*.html")) if (root / "reports").exists() else []:
        print(f"  Report:          {report.relative_to(root)}")
    if (root / "params.yaml").exists():
        env_name = load_section("env", root / "params.yaml").name
        print(f"  Best export:     mlflow.pyfunc.load_model(\"models:/vlmgym-{env_name}@champion\")")
    unsent = [p for p in spool.spool_root(root).glob("*") if p.is_dir()]
    if unsent:
        print(f"  Unsent MLflow logs of {len(unsent)} run(s) in {spool.SPOOL_DIR}/: `vlmgym tracking sync` sends them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
