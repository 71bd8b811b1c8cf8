#!/usr/bin/env bash
# Session 45 call 1 (binary 09dd6d1; kernel sources from metal-kernels at HEAD, identical):
# where a Llama-3.1-8B-shaped `turbo_attend` launch spends its time at 64K positions. The
# attention step alone against the 16-bit cache (kv_attend, 32 layers), the kernel's
# leave-one-stage-out variants (bench/turbo_variants.py; 8 layers, kernels alone), then
# Nsight Compute: GPU time per kernel of both caches, and one attention launch in full.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=$OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
python3 bench/turbo_variants.py /tmp/variants > /dev/null
timeout 200 $B/kv_attend --contexts 65536 --formats fp16,balanced --steps 20 > "$O/kv-attend-64k-32layers.md" 2>&1
echo "kv_attend 32 layers rc $? at ${SECONDS}s"; tail -3 "$O/kv-attend-64k-32layers.md"
for v in full nocopy nocompute noscores novalues; do
  KV_ATTEND_FORCE_KERNELS=1 MLX_SERVE_TURBO_KERNELS=/tmp/variants/$v timeout 60 $B/kv_attend --contexts 65536 \
    --formats balanced --layers 8 --steps 20 > "$O/variant-$v.md" 2>&1
  echo "variant $v rc $? at ${SECONDS}s: $(tail -1 "$O/variant-$v.md")"
done
timeout 150 ncu --clock-control none --csv --metrics gpu__time_duration.sum --print-units base \
  $B/kv_attend --contexts 65536 --formats fp16,balanced --layers 4 --steps 3 > "$O/ncu-times-64k.csv" 2> "$O/ncu-times-64k.err"
echo "ncu times rc $? at ${SECONDS}s"; python3 bench/ncu_times.py "$O/ncu-times-64k.csv"
left=$(( 575 - SECONDS ))
timeout $left ncu --clock-control none --kernel-name regex:turbo_attend --launch-skip 8 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SourceCounters \
  $B/kv_attend --contexts 65536 --formats balanced --layers 2 --steps 3 > "$O/ncu-full-64k.txt" 2>&1
echo "ncu full rc $? at ${SECONDS}s"
grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issued Warp|No Eligible|Block Limit|Waves|Stall" "$O/ncu-full-64k.txt" | head -50
