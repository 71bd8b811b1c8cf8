#!/usr/bin/env bash
# Issue 11's measurements on the GPU machine, in one call, on the Qwen3-30B-A3B shape whose
# routing spreads (make_moe_model.py --embed-scale 100; 16.3 GB of experts on the local disk).
# Run from the project root after `source .device/cuda-env.sh`, with `cargo build --release`'s
# mlx-serve and libmlxc.so under $BIN_DIR.
#
# The disk's rate changes over a call (a freshly written model's writeback, a cloud disk's
# burst credits), so the model is flushed first, each stage probes the disk before and after
# (expert_bench.py), and A/B runs alternate within one stage.
#
# usage: bash bench/expert_gpu.sh STAGE...
#   warm     one short streamed run: CUDA compiles its kernels (~2 min) outside the timed runs
#   disk     the read-pattern probe (bench/expert_read_pattern.py) at 8 and 16 reads in flight
#   chunks   prefill of a 2K prompt at 25% in 512- and 2048-token chunks, alternating, twice
#   readers  prefill and decode at 25% with 8 and 16 reader threads, alternating, twice
#   budgets  resident, 100%, 75%, 50%, 25% (decode hit rates and the serial bound; the
#            streamed defaults: 2048-token chunks, --expert-prefetch 8), 64 tokens
#   prefetch 25% decode without and with --expert-prefetch 8 (the default), alternating,
#            twice (H200: 69-72% -> 96-103% of the serial bound, BENCHMARKS.md)
#   pools    resident and 100% (every expert in device-made pools), alternating, twice: does
#            the resident model decode slower (one call measured 69 vs 103 tok/s)?
#   readback where a 75% decode layer's wait for its router goes: bench/managed_staging_probe.py
#            (what the reader's slabs cost in managed memory and kept on the host), then traced
#            75% runs with the slabs kept on the host (the default since session 43) and left
#            to migrate (MLX_SERVE_EXPERT_STAGING=managed), each grouped into passes (session
#            42, migrating: 0.70 ms plus ~0.85 ms an expert the layer before installed;
#            session 43, on the host: 0.6-0.9 ms whatever it installed)
#   graphs   traced 75% runs with MLX's CUDA graphs on and off (MLX_USE_CUDA_GRAPHS): is the
#            ~0.6 ms a read-back left at 75% MLX's graph per evaluation? (session 44: at most
#            ~0.15 ms of it; the decode rate the same either way)
#   timeline one 25% run with the trace log, grouped into passes (bench/expert_timeline.py),
#            with our quantized-matmul kernel and without (MLX_SERVE_QMM_KERNEL=0): what
#            the first use of each kernel costs (compiled by NVRTC in every process)
# Rough durations on an H200 with a ~1 GB/s disk: model 40 s, warm 150 s, disk 30 s, chunks
# ~6 min, readers ~8 min, budgets ~5 min (over 7 on a slow host), readback ~5 min, graphs ~4 min. A device
# call may run 10 minutes, so split them, e.g. `warm disk chunks`, then `warm readers`, then
# `warm budgets` (the model stays on a machine kept warm between calls; `warm` again in case
# MLX's compiled kernels do not).
# env: BIN_DIR (default .device/bin), MODEL (default /root/m-spread), OUT (default /tmp/experts-out)
set -uo pipefail
BIN_DIR=${BIN_DIR:-.device/bin}
MODEL=${MODEL:-/root/m-spread}
OUT=${OUT:-/tmp/experts-out}
mkdir -p "$OUT" ~/.cache/huggingface/hub
export LD_LIBRARY_PATH=$PWD/$BIN_DIR:${LD_LIBRARY_PATH:-}
# Each run's line as it ends: a call cut at its time limit keeps the runs it finished.
export PYTHONUNBUFFERED=1

echo "== machine"
date -u
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
df -h "$(dirname "$MODEL")" | tail -1

if [ ! -f "$MODEL/config.json" ]; then
  start=$(date +%s)
  # A child process: MLX's buffer cache would otherwise keep the memory the servers need.
  python3 bench/make_moe_model.py qwen3-30b-a3b "$MODEL" --embed-scale 100 >/dev/null || exit 1
  sync
  echo "model built and flushed in $(( $(date +%s) - start )) s"
fi

bench() {
  python3 bench/expert_bench.py --model "$MODEL" --bin "$BIN_DIR/mlx-serve" --prompt-kind random \
    --temp 0 "$@" 2>&1 | grep --line-buffered -v '^$'
}

# One traced 75% decode run with environment variable $1 set to $2, its log and JSON named
# $3 under $OUT, grouped into passes (the router wait by the misses of the layer before).
traced_75() {
  echo "-- $1=$2"
  ( export "$1=$2" MLX_SERVE_LOG_LEVEL=trace
    bench --no-probe --runs 75% --prompt-tokens 2048 --gen-tokens 24 --out "$OUT/$3.json" > "$OUT/$3.log" )
  grep -E '"run"' "$OUT/$3.log" | cut -c1-300
  python3 bench/expert_timeline.py "$OUT/$3.log" | tail -12
}

for stage in "$@"; do
  echo "== $stage"
  case $stage in
    warm) bench --no-probe --runs 25% --prompt-tokens 600 --gen-tokens 2 | tail -1 | cut -c1-160 ;;
    disk)
      for t in 8 16; do python3 bench/expert_read_pattern.py --model "$MODEL" --layers 10 --threads $t; done ;;
    chunks)
      for round in 1 2; do
        for size in 512 2048; do
          echo "-- round $round, --prefill-size $size"
          bench --runs 25% --prompt-tokens 2048 --prefill-size $size --gen-tokens 4 \
            --out "$OUT/chunks-$size-$round.json" | grep --line-buffered -E '"run"|disk'
        done
      done ;;
    readers)
      for round in 1 2; do
        for readers in 8 16; do
          echo "-- round $round, $readers readers"
          bench --runs 25% --readers $readers --prompt-tokens 2048 --prefill-size 512 --gen-tokens 32 \
            --out "$OUT/readers-$readers-$round.json" | grep --line-buffered -E '"run"|disk'
        done
      done ;;
    budgets)
      bench --runs resident,100%,75%,50%,25% --prompt-tokens 2048 --gen-tokens 64 \
        --out "$OUT/budgets.json" | grep --line-buffered -E '"run"|disk|tok/s' ;;
    prefetch)
      bench --runs resident,25%-pf0,25%,25%-pf0,25% --prompt-tokens 2048 --gen-tokens 64 \
        --out "$OUT/prefetch.json" | grep --line-buffered -E '"run"' | cut -c1-200 ;;
    pools)
      bench --runs resident,100%,resident,100% --prompt-tokens 2048 --gen-tokens 64 \
        --out "$OUT/pools.json" | grep --line-buffered -E '"run"' | cut -c1-200 ;;
    readback)
      python3 bench/managed_staging_probe.py
      traced_75 MLX_SERVE_EXPERT_STAGING host readback-host
      traced_75 MLX_SERVE_EXPERT_STAGING managed readback-managed ;;
    graphs)
      traced_75 MLX_USE_CUDA_GRAPHS 1 readback-graphs1
      traced_75 MLX_USE_CUDA_GRAPHS 0 readback-graphs0 ;;
    timeline)
      for qmm in 1 0; do
        echo "-- MLX_SERVE_QMM_KERNEL=$qmm"
        MLX_SERVE_QMM_KERNEL=$qmm MLX_SERVE_LOG_LEVEL=trace bench --no-probe --runs 25% --prompt-tokens 2048 \
          --gen-tokens 8 --out "$OUT/timeline-qmm$qmm.json" > "$OUT/timeline-qmm$qmm.log"
        grep -E '"run"|start-up check|in use' "$OUT/timeline-qmm$qmm.log"
        python3 bench/expert_timeline.py "$OUT/timeline-qmm$qmm.log"
      done ;;
    *) echo "unknown stage $stage" ;;
  esac
done
