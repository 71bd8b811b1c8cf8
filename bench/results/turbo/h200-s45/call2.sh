#!/usr/bin/env bash
# Session 45 call 2 (binary 09dd6d1): the attention kernel alone (kv_attend's kernels column,
# 8 layers, Llama-3.1-8B shape, 1 row) at 32K and 64K positions by attention block target
# (MLX_SERVE_TURBO_BLOCKS; call 1: 288 blocks fill 0.55 of a wave at 4 blocks an SM), for the
# built-in kernel and for metal-kernels/ as edited (one 8-byte table load for a centroid pair's
# high and low parts); the kv::turbo tests with the edited sources first.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader
MLX_SERVE_TURBO_KERNELS=$PWD/metal-kernels timeout 200 $B/mlx_serve_lib kv::turbo --test-threads 1 > "$O/tests-edited.txt" 2>&1
echo "tests rc $? at ${SECONDS}s: $(grep 'test result' "$O/tests-edited.txt")"; grep -E "FAILED|panicked" "$O/tests-edited.txt" | head -5
timeout 100 $B/kv_attend --contexts 32768,65536 --formats fp16,balanced --layers 8 --steps 20 > "$O/fp16-8layers.md" 2>&1
echo "fp16 reference at ${SECONDS}s"; tail -4 "$O/fp16-8layers.md"
for blocks in 256 512 384 528 1024; do
  for src in builtin edited; do
    if [ $src = edited ]; then export MLX_SERVE_TURBO_KERNELS=$PWD/metal-kernels; else unset MLX_SERVE_TURBO_KERNELS; fi
    MLX_SERVE_TURBO_BLOCKS=$blocks timeout 60 $B/kv_attend --contexts 32768,65536 --formats balanced --layers 8 --steps 20 > "$O/$src-$blocks.md" 2>&1
    echo "$src $blocks at ${SECONDS}s: $(tail -2 "$O/$src-$blocks.md" | cut -d'|' -f2,8,9 | tr '\n' ' ')"
  done
done
