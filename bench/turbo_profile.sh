#!/usr/bin/env bash
# TurboQuant kernel work on the GPU machine, in one call: the kernels' unit tests, the
# decode-step attention bench (server/benches/kv_attend.rs) against the 16-bit cache, and
# Nsight Compute's GPU time of every kernel a step runs (and, optionally, a full profile of one
# attention launch). Variant kernel sources (MLX_SERVE_TURBO_KERNELS folders) run one after
# another with the same tests and bench, so versions compare on one warm machine.
# Run from the project root after `source .device/prelude.sh` (scripts/device-bundle.sh), with $BIN_DIR holding
# mlx_serve_lib (the server crate's unit-test executable), kv_attend and libmlxc.so (and
# mlx-serve for the whole model): `scripts/device-bundle.sh --bench` packs them.
#
# usage: bash bench/turbo_profile.sh [builtin|DIR]...     (default: builtin)
# env: BIN_DIR (default .device/bin), OUT (default /tmp/turbo-out), CONTEXTS (32768,65536),
#      BLOCKS="256 512" (kv_attend once per attention block target, MLX_SERVE_TURBO_BLOCKS),
#      SHAPE (kv_attend's shape flags, default the Llama-3.1-8B shape; the Qwen3-30B-A3B shape:
#      SHAPE="--layers 48 --kv-heads 4 --heads 32", where host time decides: BENCHMARKS.md; the
#      ncu runs keep their own few layers: kv_attend takes a flag's first value),
#      NCU=1 (per-kernel GPU times of each version, at each of NCU_CONTEXTS, default 32768, and
#      each of BLOCKS; with the GPU's own clocks, as the timed runs have them),
#      NCU_FULL=1 (one attention launch in full),
#      TESTS=0 (skip the unit tests of the built-in kernels, e.g. already run on this build),
#      MODEL=1 (then bench/turbo_bench.py on a Llama-3.1-8B-shaped 4-bit model, built once
#      under $MODELS, default /tmp/bench-models, if the tests passed)
set -uo pipefail
BIN_DIR=${BIN_DIR:-.device/bin}
OUT=${OUT:-/tmp/turbo-out}
CONTEXTS=${CONTEXTS:-32768,65536}
SHAPE=${SHAPE:-}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$BIN_DIR:${LD_LIBRARY_PATH:-}
echo "== machine"; date -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
[ $# -gt 0 ] || set -- builtin
status=0
first=1
for version in "$@"; do
  if [ "$version" = builtin ]; then unset MLX_SERVE_TURBO_KERNELS; else export MLX_SERVE_TURBO_KERNELS=$PWD/$version; fi
  tag=$(basename "$version")
  echo "== $tag: kv::turbo tests"
  if [ "$version" = builtin ] && [ "${TESTS:-1}" = 0 ]; then
    echo "skipped"
  elif ! grep -q "test result: ok" <(timeout 300 "$BIN_DIR/mlx_serve_lib" kv::turbo --test-threads 1 2>&1 | tee "$OUT/tests-$tag.txt"); then
    grep -E "^test .*FAILED|panicked|test result" "$OUT/tests-$tag.txt" | head; status=1; continue
  fi
  for blocks in ${BLOCKS:-default}; do
    echo "== $tag: kv_attend, attention blocks $blocks"
    if [ "$blocks" = default ]; then unset MLX_SERVE_TURBO_BLOCKS; else export MLX_SERVE_TURBO_BLOCKS=$blocks; fi
    timeout 300 "$BIN_DIR/kv_attend" --contexts "$CONTEXTS" --formats fp16,balanced $SHAPE --steps 20 2>&1 | tee "$OUT/kv_attend-$tag-$blocks.md" | tail -6 || status=1
  done
  unset MLX_SERVE_TURBO_BLOCKS
  if [ "${NCU:-0}" = 1 ]; then
    for blocks in ${BLOCKS:-default}; do
      if [ "$blocks" = default ]; then unset MLX_SERVE_TURBO_BLOCKS; else export MLX_SERVE_TURBO_BLOCKS=$blocks; fi
      for c in ${NCU_CONTEXTS:-32768}; do
        echo "== $tag: GPU time per kernel (ncu, the GPU's own clocks), $c tokens, 4 layers, attention blocks $blocks"
        f="$OUT/ncu-times-$tag-$blocks-$c"
        timeout 400 ncu --clock-control none --csv --metrics gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size \
          --print-units base "$BIN_DIR/kv_attend" --contexts $c --formats fp16,balanced --layers 4 --steps 3 $SHAPE >"$f.csv" 2>"$f.err" || status=1
        python3 bench/ncu_times.py "$f.csv" || status=1
      done
    done
    unset MLX_SERVE_TURBO_BLOCKS
  fi
  if [ "$first" = 1 ] && [ "${NCU_FULL:-0}" = 1 ]; then
    echo "== $tag: one attention launch in full (ncu)"
    timeout 300 ncu --clock-control none --kernel-name regex:turbo_attend --launch-skip 8 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      "$BIN_DIR/kv_attend" --contexts 32768 --formats balanced --layers 2 --steps 3 $SHAPE >"$OUT/ncu-full-$tag.txt" 2>&1 || status=1
    grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall|Block Limit|Shared Memory Configuration|Waves" "$OUT/ncu-full-$tag.txt" | head -60
  fi
  if [ "$first" = 1 ] && [ "${MODEL:-0}" = 1 ]; then
    echo "== $tag: whole model (Llama-3.1-8B shape, 4-bit)"
    models=${MODELS:-/tmp/bench-models}; m=$models/llama-3.1-8b-4bit
    [ -f "$m/config.json" ] || python3 bench/make_model.py llama-3.1-8b "$m" --dtype bfloat16 --bits 4 >/dev/null || status=1
    timeout 900 python3 bench/turbo_bench.py --model "$m" --mlx-serve "$BIN_DIR/mlx-serve" --python python3 \
      --out "$OUT/turbo-bench-$tag.json" --contexts "$CONTEXTS" --configs fp16,balanced --runs 1 2>&1 | tail -12 || status=1
  fi
  first=0
done
exit $status
