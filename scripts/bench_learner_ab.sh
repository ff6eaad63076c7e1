#!/usr/bin/env bash
# The learner update of another checkout (e.g. an earlier commit: `git worktree add /tmp/before <commit>`) against
# this one, alternated, `vlmgym bench learner` each: one JSON line per run, then the best step time of each side.
#
#   scripts/bench_learner_ab.sh OTHER_CHECKOUT [ROUNDS=2] [extra `vlmgym bench learner` flags...]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
other="$(cd "$1" && pwd)"
rounds="${2:-2}"
shift $(( $# >= 2 ? 2 : 1 ))
PYTHON="${PYTHON:-python}"
out="$(mktemp -d)"
unset XLA_FLAGS
for round in $(seq "$rounds"); do
  for side in other here; do
    dir="$other"; [ "$side" = here ] && dir="$here"
    (cd "$dir" && PYTHONPATH="$dir/src" "$PYTHON" -m vlmgym.cli bench learner --repeats 5 --skip-4b "$@" \
      > "$out/$side-$round.json" 2>/dev/null)
  done
done
"$PYTHON" - "$out" <<'PY'
import json, sys
from pathlib import Path
runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))}
cases = [(c, v) for c in ("tiny_default", "large_image") for v in ("shared", "per_copy")]
for name, run in runs.items():
    print(name, {f"{c}/{v}": round(run[c][v]["step_s"], 3) for c, v in cases})
for c, v in cases:
    best = {side: min(r[c][v]["step_s"] for n, r in runs.items() if n.startswith(side)) for side in ("other", "here")}
    print(f"{c}/{v}: other {best['other']:.3f} s, here {best['here']:.3f} s, {best['other'] / best['here']:.2f}x")
PY
