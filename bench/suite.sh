#!/usr/bin/env bash
# One command per machine for the benchmark matrix (bench/suite.py): builds the random-weight
# models of the preset (once), then runs mlx-serve and mlx_lm.server side by side on each and
# writes a results folder per model with report.md and the charts.
#
# usage: bash bench/suite.sh [cpu|gpu] [extra suite.py flags...]      (from the project root)
#   cpu  llama-tiny fp32 (MLX's x86 CPU backend prefills SmolLM2-135M at ~11 tok/s, too slow
#        for a matrix): prompts 512/4K/16K, 32 generated, waves of at most 16K prompt tokens
#   gpu  Llama-3.2-1B 4-bit: prompts 512/4K/16K/32K x 1/4/16 streams, 128 generated;
#        then Llama-3.1-8B 4-bit: prompts 512/4K/16K, waves of at most 64K prompt tokens
#   default: gpu when MLX's default device is a GPU, else cpu
# env: PY   Python with MLX and mlx-lm (default vendor/pyref/bin/python, else python3;
#           on the GPU machine: source .device/cuda-env.sh first, then PY=python3)
#      BIN  mlx-serve (default target/release/mlx-serve, else .device/bin/mlx-serve)
#      MODELS  where models are built (default /tmp/bench-models)
#      RESULTS where result folders go (default bench/results/suite); a folder is named
#           DEVICE-COMMIT-MODEL, so running the same command again resumes an unfinished one
#      ONLY  run only these preset models (space-separated names, e.g. "llama-3.2-1b-4bit")
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  if [ -x vendor/pyref/bin/python ]; then PY=vendor/pyref/bin/python; else PY=python3; fi
fi
if [ -z "${BIN:-}" ]; then
  if [ -x target/release/mlx-serve ]; then BIN=target/release/mlx-serve; else BIN=.device/bin/mlx-serve; fi
fi
MODELS=${MODELS:-/tmp/bench-models}
RESULTS=${RESULTS:-bench/results/suite}

preset=${1:-}
case $preset in
  cpu | gpu) shift ;;
  *) if "$PY" -c 'import mlx.core as mx, sys; sys.exit(mx.default_device() != mx.gpu)'; then preset=gpu; else preset=cpu; fi ;;
esac

# name  make_model.py shape  make_model.py flags  suite.py flags
case $preset in
  cpu) jobs=("llama-tiny-fp32|llama-tiny|--dtype float32|--contexts 512,4096,16384 --gen-tokens 32 --max-wave-tokens 16384") ;;
  gpu) jobs=("llama-3.2-1b-4bit|llama-3.2-1b|--dtype bfloat16 --bits 4|--contexts 512,4096,16384,32768 --gen-tokens 128"
             "llama-3.1-8b-4bit|llama-3.1-8b|--dtype bfloat16 --bits 4|--contexts 512,4096,16384 --gen-tokens 128 --max-wave-tokens 65536") ;;
esac

device=$("$PY" - <<'EOF'
import mlx.core as mx, re, subprocess
name = "cpu"
if mx.default_device() == mx.gpu:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout
    name = out.splitlines()[0] if out.strip() else "gpu"
    name = re.sub(r"^NVIDIA ", "", name).split()[0]
print(name.lower())
EOF
)
# The binary's commit: scripts/device-bundle.sh writes it beside a carried binary; else git's.
if [ -f "$(dirname "$BIN")/../commit" ]; then
  commit=$(cat "$(dirname "$BIN")/../commit")
else
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit-dirty"
fi

status=0
for job in "${jobs[@]}"; do
  IFS='|' read -r name shape mflags sflags <<<"$job"
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then continue; fi
  dir=$MODELS/$name
  if [ ! -f "$dir/config.json" ]; then
    echo "== make $name"
    # shellcheck disable=SC2086
    "$PY" bench/make_model.py "$shape" "$dir" $mflags || { status=1; continue; }
  fi
  out=$RESULTS/$device-$commit-$name
  echo "== $name -> $out"
  cmd="bash bench/suite.sh $preset${*:+ $*}"
  # shellcheck disable=SC2086
  "$PY" bench/suite.py --model "$dir" --model-name "$name" --mlx-serve "$BIN" --python "$PY" --out "$out" \
    --commit "$commit" --command "$cmd" $sflags "$@" || status=1
done
exit $status
