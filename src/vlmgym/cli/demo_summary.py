"""Printed at the end of `make demo`: the results table and where to look."""

from __future__ import annotations

import json

from vlmgym.params import load_section
from vlmgym.tracking import spool
from vlmgym.tracking.stage_runs import repo_root, tracking_uri


def main() -> int:
    root = repo_root()
    metrics_dir = root / "metrics"
    for path in sorted(metrics_dir.glob("*.json")) if metrics_dir.exists() else []:
        print(f"\n== {path.relative_to(root)} ==")
        table = root / "reports" / f"{path.stem}.md"
        print(table.read_text() if table.exists() else json.dumps(json.loads(path.read_text()), indent=2))
    uri = tracking_uri()
    print("\nWhere to look:")
    print(f"  MLflow runs:     mlflow ui --backend-store-uri {uri}   (then open http://127.0.0.1:5000)")
    print("  DVC metrics:     .venv/bin/dvc metrics show   |   .venv/bin/dvc dag")
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
