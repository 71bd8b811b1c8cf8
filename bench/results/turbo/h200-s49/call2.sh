#!/usr/bin/env bash
# Session 49 call 2 (binary cd53907), the machine of call 1: the 16-bit decode attention for rows
# of other lengths (our dense_attend) against MLX's fused attention for rows of one length and
# MLX's masked attention (MLX_SERVE_DENSE_KERNEL=0), Llama-3.1-8B and Qwen3-30B-A3B attention
# shapes, 4 rows at 32K and 64K; then dense_attend with 448 blocks targeted.
set -u
source .device/prelude.sh
O=$OUT; export MLX_PTX_CACHE_DIR=/root/ptx
date -u
run() { local name=$1; shift; echo "== $name: $*"; timeout 150 "$@" 2>&1 | tee "$O/$name.txt" | grep -E "^\||rror"; echo "   (${SECONDS}s)"; }
L="--rows 4 --contexts 32768,65536 --formats fp16,balanced --layers 8 --steps 20 --repeats 3"
A="--rows 4 --contexts 32768,65536 --formats fp16,balanced --layers 8 --steps 20 --repeats 3 --kv-heads 4 --heads 32 --head-dim 128"
run llama-one-length $B/kv_attend $L
run llama-ragged $B/kv_attend $L --ragged
MLX_SERVE_DENSE_KERNEL=0 run llama-ragged-mlx-masked $B/kv_attend $L --ragged
MLX_SERVE_TURBO_BLOCKS=448 run llama-ragged-448 $B/kv_attend $L --ragged
run a3b-one-length $B/kv_attend $A
run a3b-ragged $B/kv_attend $A --ragged
echo "ended at ${SECONDS}s"
