#!/usr/bin/env bash
# One command per machine for an A/B of two mlx-serve builds (bench/ab.py): builds the
# preset's random-weight models (once), then runs both builds side by side on each.
#
# usage: bash bench/ab.sh [cpu|gpu] BEFORE_BIN [AFTER_BIN]      (from the project root)
#   cpu  llama-tiny fp32: default at prompts 512/2048 x 1/8 streams, --kv-bits 8 at 512 x 1/8;
#        gemma3-tiny fp32 (sliding windows of 256) at 512 x 1/8; 64 generated
#   gpu  Llama-3.2-1B 4-bit: default at 512/4096 x 1/8 streams, --kv-bits 8 at 512/4096 x 8;
#        Gemma-3-1B bf16 (sliding windows of 512) at 512/4096 x 1/8; 128 generated
#   AFTER_BIN defaults to target/release/mlx-serve, else .device/bin/mlx-serve
# env: PY (Python with MLX and mlx-lm; default vendor/pyref/bin/python, else python3),
#      MODELS (default /tmp/bench-models), OUT (default bench/results/ab), REPEATS (default 2),
#      ONLY (run only these preset models, space-separated names, e.g. "gemma-3-1b-bf16")
set -uo pipefail
cd "$(dirname "$0")/.."
preset=${1:?usage: bash bench/ab.sh cpu|gpu BEFORE_BIN [AFTER_BIN]}
before=${2:?usage: bash bench/ab.sh cpu|gpu BEFORE_BIN [AFTER_BIN]}
after=${3:-}
if [ -z "$after" ]; then
  if [ -x target/release/mlx-serve ]; then after=target/release/mlx-serve; else after=.device/bin/mlx-serve; fi
fi
if [ -z "${PY:-}" ]; then
  if [ -x vendor/pyref/bin/python ]; then PY=vendor/pyref/bin/python; else PY=python3; fi
fi
MODELS=${MODELS:-/tmp/bench-models}
OUT=${OUT:-bench/results/ab}
mkdir -p "$OUT"

# name  make_model.py shape  make_model.py flags  ab.py flags (the results file is named
# after the model and the configs)
case $preset in
  cpu) jobs=("llama-tiny-fp32|llama-tiny|--dtype float32|--configs default --contexts 512,2048 --concurrency 1,8 --gen-tokens 64"
             "llama-tiny-fp32|llama-tiny|--dtype float32|--configs kv8 --contexts 512 --concurrency 1,8 --gen-tokens 64"
             "gemma3-tiny-fp32|gemma3-tiny|--dtype float32|--configs default --contexts 512 --concurrency 1,8 --gen-tokens 64") ;;
  gpu) jobs=("llama-3.2-1b-4bit|llama-3.2-1b|--dtype bfloat16 --bits 4|--configs default --contexts 512,4096 --concurrency 1,8 --gen-tokens 128"
             "llama-3.2-1b-4bit|llama-3.2-1b|--dtype bfloat16 --bits 4|--configs kv8 --contexts 512,4096 --concurrency 8 --gen-tokens 128"
             "gemma-3-1b-bf16|gemma-3-1b|--dtype bfloat16|--configs default --contexts 512,4096 --concurrency 1,8 --gen-tokens 128") ;;
  *) echo "unknown preset $preset (cpu or gpu)"; exit 2 ;;
esac

status=0
for job in "${jobs[@]}"; do
  IFS='|' read -r name shape mflags aflags <<<"$job"
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
  dir=$MODELS/$name
  if [ ! -f "$dir/config.json" ]; then
    echo "== make $name"
    # A child process: MLX's buffer cache would otherwise keep the memory the servers need.
    # shellcheck disable=SC2086
    "$PY" bench/make_model.py "$shape" "$dir" $mflags || { status=1; continue; }
  fi
  configs=$(sed -E 's/.*--configs ([^ ]+).*/\1/' <<<"$aflags")
  echo "== $name $configs"
  # shellcheck disable=SC2086
  "$PY" bench/ab.py --model "$dir" --build "before=$before" --build "after=$after" --python "$PY" \
    --repeats "${REPEATS:-2}" --out "$OUT/$preset-$name-$configs.json" $aflags || status=1
done
exit $status
