#!/usr/bin/env bash
# Session 50 call 3 (binary 5d03378: dense_attend's lane loop as built in fd7b346), the machine of calls 1-2:
# H200: issue 19's 16 x 32K cell on the Llama-3.1-8B shape (4-bit, random weights) through the
# server again, 16-bit cache against `balanced`, session 47's cell ran
# the 16-bit side on the dense_attend loop before fd7b346.
set -u
source .device/prelude.sh
O=$OUT; M=/root/llama; mkdir -p ~/.cache/huggingface/hub; export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit); cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
[ -f $M/config.json ] || timeout 120 python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "model at ${SECONDS}s"
for ctx in 32768; do
  left=$((590 - SECONDS)); [ $left -lt 100 ] && { echo "no time for 16 x $ctx"; continue; }
  (cd bench && timeout $left python3 turbo_bench.py --model $M --mlx-serve $B/mlx-serve --python python3 \
    --out "$O/llama-turbo-streams16-$ctx.json" --gen-tokens 128 --runs 1 --configs fp16,balanced --streams 16 --contexts $ctx \
    --warm-context 2048) 2>&1 | tee "$O/llama-turbo-streams16-$ctx.txt" | grep -E "^\[|^\|"
  echo "16 x $ctx ended at ${SECONDS}s"
done
echo "ended at ${SECONDS}s"
