#!/usr/bin/env bash
# Session 46 call 1 (HEAD 4ee3d51 + bench/results/turbo/h200-s45/byte-index-kernel.diff, built in):
# the kv::turbo tests on CUDA with the byte-index kernel, then Nsight Compute's GPU time of the
# attention kernel alone (kv_attend, balanced, 1 row), the byte-index kernel ("byte", built in)
# against HEAD's source ("head", head-kernels/ through MLX_SERVE_TURBO_KERNELS): the Llama-3.1-8B
# shape (4 layers) at the default block target (448) at 64K and 32K, and the Qwen3-30B-A3B shape
# (4 KV heads, 32 query heads) at block targets 256 (its default) and 360. head-kernels/ held
# 4ee3d51's metal-kernels/turbo_common.cuh, turbo_encode.cu and turbo_attend.cu (untracked when it
# ran; `git show 4ee3d51:metal-kernels/FILE` makes it again).
set -u
source .device/prelude.sh
O=$OUT; H=$PWD/bench/results/turbo/h200-s46/head-kernels
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 $B/mlx_serve_lib kv::turbo --test-threads 1 > $O/tests-byte.txt 2>&1
echo "tests rc $? at ${SECONDS}s"; grep -E "test result|FAILED|panicked" $O/tests-byte.txt | head
t() { # tag blocks context shape...
  local tag=$1 blocks=$2 c=$3; shift 3
  local src=(env -u MLX_SERVE_TURBO_KERNELS); [ "$tag" = byte ] || src=(env MLX_SERVE_TURBO_KERNELS=$H)
  local bl=(env -u MLX_SERVE_TURBO_BLOCKS); [ "$blocks" = default ] || bl=(env MLX_SERVE_TURBO_BLOCKS=$blocks)
  local f="$O/ncu-$tag-$blocks-$c-$SECONDS.csv"
  "${src[@]}" "${bl[@]}" KV_ATTEND_FORCE_KERNELS=1 timeout 90 ncu --clock-control none --csv \
    --kernel-name regex:turbo_attend --metrics gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size \
    --print-units base $B/kv_attend --contexts $c --formats balanced --layers 4 --steps 3 "$@" > "$f" 2> /dev/null
  echo "$tag blocks $blocks context $c $* at ${SECONDS}s: $(python3 bench/ncu_times.py "$f" | grep -i bfloat16 | cut -d'|' -f3-5)" \
    "$(grep -m1 launch__registers_per_thread "$f" | awk -F'","' '{print "registers " $NF}' | tr -d '"')" \
    "$(grep -m1 launch__grid_size "$f" | awk -F'","' '{print "grid " $NF}' | tr -d '"')"
}
for rep in 1 2; do
  t byte default 65536
  t head default 65536
done
t byte default 32768
t head default 32768
A3B=(--kv-heads 4 --heads 32)
for blocks in 256 360; do
  t byte $blocks 32768 "${A3B[@]}"
  t head $blocks 32768 "${A3B[@]}"
done
t byte 360 65536 "${A3B[@]}"
t head 360 65536 "${A3B[@]}"
t byte 256 65536 "${A3B[@]}"
