#!/usr/bin/env bash
# The GPU checks: two separate commands, each with its own time limit, each printing one JSON report on stdout (the
# progress goes to stderr). Run them one at a time; `make install-gpu` installs what they need.
#
#   scripts/bench_gpu.sh [rollout] [HBM bytes/s, default H200 4.8e12] [extra `vlmgym bench rollout` flags...]
#   scripts/bench_gpu.sh smoke [scratch folder, default $TMPDIR/vlmgym-gpu-smoke]
#
# 1. rollout (the default): Qwen3-VL-4B's real config with random weights in bf16, decode at batch 64 (8 prompts x
#    group 8), the JAX engine vs transformers generate. Needs JAX with CUDA and torch with CUDA. Budget: < 8 minutes
#    on one H200 (two model inits, two JAX compiles, HF generate).
#
# 2. smoke: configs/gpu_smoke.yaml end to end (`vlmgym preset configs/gpu_smoke.yaml && dvc repro`: a random model
#    of Qwen3-VL-4B's text width and depth, LoRA, 4 SFT and 4 GRPO steps on a few hundred synthetic images; no
#    network) in a scratch copy of this checkout, so params.yaml, dvc.lock, the outputs and mlflow.db here stay as
#    they are. Needs JAX with CUDA (it stops at once when JAX sees no GPU) and about 40 GB of free disk in the
#    scratch folder (estimated from the model's size, docs/scaling.md; the copy's DVC cache hardlinks the outputs
#    instead of copying them). Each run stops after SMOKE_TIMEOUT_S seconds (default 300, so that a session can run
#    it twice); running it again goes on from the last finished stage (DVC skips the stages done; sft and train
#    resume from their checkpoints). Its report: the seconds of each stage in this run, the stage it stopped in (if
#    any), and from the sft and train runs' MLflow metrics the first step's time (compiles included) and the median
#    of the others. The copy is made once: delete the scratch folder to start over from the checkout as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"

if [ "${1:-}" != smoke ]; then
  if [ "${1:-}" = rollout ]; then shift; fi
  BANDWIDTH="${1:-4.8e12}"
  shift || true
  exec timeout 480 "$PYTHON" -m vlmgym.cli bench rollout --config 4b --random-weights --dtype bf16 \
    --prompts 8 --group 8 --max-new-tokens 128 --repeats 2 --hbm-bandwidth "$BANDWIDTH" "$@"
fi

# ---- 2. smoke ----------------------------------------------------------------------------------------------------
CHECKOUT="$PWD"
DIR="$(realpath -m "${2:-${TMPDIR:-/tmp}/vlmgym-gpu-smoke}")"
LIMIT="${SMOKE_TIMEOUT_S:-300}"
STAGES=(download shard base_model convert sft train rollout export evaluate)
PYTHON="$(command -v "$PYTHON")" || { echo "{\"check\": \"gpu_smoke\", \"error\": \"no $PYTHON\"}"; exit 1; }
case "$PYTHON" in /*) ;; *) PYTHON="$PWD/$PYTHON";; esac  # absolute (a venv's python stays itself): used from $DIR
started=$SECONDS

fail() {  # the report of a check that could not start
  "$PYTHON" -c 'import json, sys; print(json.dumps({"check": "gpu_smoke", "error": sys.argv[1]}))' "$1"
  exit 1
}
case "$DIR/" in "$CHECKOUT"/*) fail "the scratch folder $DIR lies inside the checkout";; esac
problem="$("$PYTHON" -c '
try:
    import dvc, jax, mlflow  # noqa: F401
except ImportError as err:
    print(f"{err}: install the project with make install-gpu")
else:
    if jax.default_backend() != "gpu":
        print(f"JAX sees no GPU (backend {jax.default_backend()}): make install-gpu installs JAX with CUDA")
' 2>/dev/null || echo "$PYTHON could not run")"
[ -z "$problem" ] || fail "$problem"

if [ ! -f "$DIR/.smoke-ready" ]; then  # the checkout's files, without its outputs, caches and stores
  if [ -f "$DIR/.smoke-copying" ]; then rm -rf "$DIR"; fi  # a copy of this script's, cut short
  [ ! -e "$DIR" ] || [ -z "$(ls -A "$DIR")" ] || fail "$DIR holds other files: name a new or empty folder"
  mkdir -p "$DIR" && touch "$DIR/.smoke-copying"
  tar -C "$CHECKOUT" -cf - --exclude=./.git --exclude=./.venv --exclude=./.dvc/cache --exclude=./.dvc/tmp \
    --exclude=./data --exclude=./models --exclude=./outputs --exclude=./checkpoints --exclude=./reports \
    --exclude=./mlruns --exclude=./mlartifacts --exclude=./mlflow-spool --exclude='./mlflow.db*' \
    --exclude=__pycache__ --exclude=.hypothesis --exclude=.pytest_cache --exclude=.ruff_cache \
    --exclude='*.egg-info' . | tar -C "$DIR" -xf -
  # DVC needs a git repository, or its no_scm mode where git is missing
  (cd "$DIR" && { git init -q 2>/dev/null || printf '[core]\n    no_scm = true\n' >> .dvc/config.local; } \
     && "$PYTHON" -m dvc config --local cache.type hardlink,copy \
     && PYTHONPATH="$DIR/src" "$PYTHON" -m vlmgym.cli preset configs/gpu_smoke.yaml \
     && touch .smoke-ready && rm .smoke-copying) >&2
fi

# The stages call `python`: make it this $PYTHON, running the copy's code; MLflow logs to the copy's mlflow.db.
mkdir -p "$DIR/.smoke-bin"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$PYTHON" > "$DIR/.smoke-bin/python"
chmod +x "$DIR/.smoke-bin/python"
export PATH="$DIR/.smoke-bin:$PATH" PYTHONPATH="$DIR/src${PYTHONPATH:+:$PYTHONPATH}"
unset MLFLOW_TRACKING_URI
cd "$DIR"

timings="" stopped_in="" status=0
for stage in "${STAGES[@]}" ""; do  # "": a last plain `dvc repro`, for any stage the list lacks
  left=$((LIMIT - (SECONDS - started)))
  if [ "$left" -le 0 ]; then stopped_in="${stage:-rest}"; status=124; break; fi
  begin=$SECONDS
  rc=0
  timeout "$left" "$PYTHON" -m dvc repro ${stage:+"$stage"} >&2 || rc=$?
  timings="$timings${timings:+, }\"${stage:-rest}\": $((SECONDS - begin))"
  if [ "$rc" -ne 0 ]; then stopped_in="${stage:-rest}"; status=$rc; break; fi
done

"$PYTHON" - "$LIMIT" "{$timings}" "$stopped_in" "$status" <<'EOF'
import json
import statistics
import sys
from pathlib import Path

import jax

limit, stages, stopped_in, status = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
report = {"check": "gpu_smoke", "preset": "configs/gpu_smoke.yaml", "folder": str(Path.cwd()),
          "device": f"{jax.devices()[0].device_kind} (jax {jax.__version__})", "timeout_s": limit,
          "stage_seconds": stages, "complete": status == 0, "stopped_in": stopped_in or None,
          "exit_status": status, "steps": {}}
if Path("mlflow.db").exists():
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{Path('mlflow.db').resolve()}")
    experiment = client.get_experiment_by_name("vlmgym")
    for stage in ("sft", "train") if experiment else ():
        runs = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{stage}'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        for key in ("step_time_s", "rollout_time_s", "update_time_s") if runs else ():
            history = sorted(client.get_metric_history(runs[0].info.run_id, key), key=lambda m: m.step)
            values = [m.value for m in history]
            if values:
                report["steps"][f"{stage}.{key}"] = {
                    "steps": len(values), "first": round(values[0], 3),
                    "median_after_first": round(statistics.median(values[1:]), 3) if len(values) > 1 else None}
print(json.dumps(report))
EOF
exit "$status"
