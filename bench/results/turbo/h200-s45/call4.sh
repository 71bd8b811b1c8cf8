#!/usr/bin/env bash
# Session 45 call 4 (binary 09dd6d1): call 3 again with the registers and grid of each launch,
# repeated and interleaved (call 3's single runs disagreed: the edited kernel slower at 512 blocks
# only): Nsight Compute's GPU time of the attention kernel alone (kv_attend, balanced,
# Llama-3.1-8B shape, 4 layers, 1 row), built-in and edited sources, attention block targets
# 256, 448 (480 blocks: within one wave of 4 blocks an SM on 132 SMs) and 512 (544 blocks).
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader
t() { # tag kernels-dir blocks context
  local src=(env -u MLX_SERVE_TURBO_KERNELS); [ "$2" = builtin ] || src=(env MLX_SERVE_TURBO_KERNELS=$2)
  local f="$O/ncu-$1-$3-$4-$SECONDS.csv"
  "${src[@]}" MLX_SERVE_TURBO_BLOCKS=$3 KV_ATTEND_FORCE_KERNELS=1 timeout 90 ncu --clock-control none --csv \
    --kernel-name regex:turbo_attend_bfloat --metrics gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size \
    --print-units base $B/kv_attend --contexts $4 --formats balanced --layers 4 --steps 3 > "$f" 2> /dev/null
  echo "$1 blocks $3 context $4 at ${SECONDS}s: $(python3 bench/ncu_times.py "$f" | grep bfloat16 | cut -d'|' -f3-5)" \
    "$(grep -m1 launch__registers_per_thread "$f" | awk -F'","' '{print "registers " $NF}' | tr -d '"')" \
    "$(grep -m1 launch__grid_size "$f" | awk -F'","' '{print "grid " $NF}' | tr -d '"')"
}
for rep in 1 2; do
  for blocks in 256 448 512; do
    t builtin builtin $blocks 65536
    t edited $PWD/metal-kernels $blocks 65536
  done
done
t builtin builtin 448 32768
t edited $PWD/metal-kernels 448 32768
