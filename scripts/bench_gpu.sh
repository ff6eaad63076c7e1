#!/usr/bin/env bash
# GPU rollout benchmark: Qwen3-VL-4B's real config with random weights in bf16, decode at batch 64
# (8 prompts x group 8), the JAX engine vs transformers generate. Needs JAX with CUDA and torch with CUDA.
# Budget: < 8 minutes on one H200 (two model inits, two JAX compiles, HF generate). Prints one JSON report.
#
#   scripts/bench_gpu.sh [HBM bytes/s, default H200 4.8e12] [extra `vlmgym bench rollout` flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
BANDWIDTH="${1:-4.8e12}"
shift || true
PYTHON="${PYTHON:-python}"
exec timeout 480 "$PYTHON" -m vlmgym.cli bench rollout --config 4b --random-weights --dtype bf16 \
  --prompts 8 --group 8 --max-new-tokens 128 --repeats 2 --hbm-bandwidth "$BANDWIDTH" "$@"
