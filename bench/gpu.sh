#!/usr/bin/env bash
# Builds random-weight models with real shapes and runs generate_bench.py on each, on the GPU
# machine (or anywhere MLX runs). Run from the project root, after MLX is set up (on the GPU
# machine: `source .device/cuda-env.sh`).
#
# usage: bash bench/gpu.sh JOB...   JOB = NAME:QUANT:PROMPT:GEN[:RUNS], e.g. llama-3.2-1b:bf16:512:128
#   NAME  one of make_model.py's shapes; QUANT bf16 | fp32 | 4bit (bf16 scales and activations)
#         | 4bit-fp32 (fp32 scales and activations); a model is built once per NAME-QUANT
#   env:  PY (python with mlx + mlx-lm, default python3), BIN (default .device/bin/mlx-serve),
#         RUNS (when a job names none, default 3), MODELS (model folder, default /tmp/bench-models),
#         OUT (where the JSON files go, default /tmp/bench-out), TAG (appended to their names)
# Prints the machine, then per job the model build time and generate_bench.py's table.
set -uo pipefail
PY=${PY:-python3}
BIN=${BIN:-.device/bin/mlx-serve}
RUNS=${RUNS:-3}
MODELS=${MODELS:-/tmp/bench-models}
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$MODELS" "$OUT"

echo "== machine"
date -u
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
grep -m1 'model name' /proc/cpuinfo; nproc
"$BIN" info
"$PY" -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, "mlx-lm", mlx_lm.__version__, mx.default_device())'

status=0
for job in "$@"; do
  IFS=: read -r name quant prompt gen runs <<<"$job"
  runs=${runs:-$RUNS}
  dir=$MODELS/$name-$quant
  case $quant in
    bf16) margs=(--dtype bfloat16) ;;
    fp32) margs=(--dtype float32) ;;
    4bit) margs=(--dtype bfloat16 --bits 4) ;;
    4bit-fp32) margs=(--dtype float32 --bits 4) ;;
    *) echo "unknown QUANT $quant"; status=1; continue ;;
  esac
  if [ ! -f "$dir/config.json" ]; then
    echo "== make $name $quant"
    t0=$SECONDS
    "$PY" bench/make_model.py "$name" "$dir" "${margs[@]}" || { status=1; continue; }
    echo "made in $((SECONDS - t0)) s; $(du -sh "$dir" | cut -f1)"
  fi
  echo "== bench $name $quant prompt $prompt gen $gen runs $runs"
  t0=$SECONDS
  "$PY" bench/generate_bench.py --model "$dir" --mlx-serve "$BIN" --prompt-tokens "$prompt" \
    --gen-tokens "$gen" --runs "$runs" --out "$OUT/$name-$quant-p$prompt-g$gen-r$runs${TAG:+-$TAG}.json" || status=1
  echo "bench took $((SECONDS - t0)) s"
done
exit $status
