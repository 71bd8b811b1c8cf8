#!/usr/bin/env bash
# Session 50 call 4 (binary 5d03378): the Qwen3-30B-A3B shape's 16 x 32K cell through the server,
# the 16-bit cache alone (its side of session 49's cell ran the dense_attend loop before fd7b346;
# `balanced` reads its cache with turbo_attend, whose code fd7b346 left as it was: session 49's
# balanced figure, binary cd53907, stands beside it). MLX_SERVE_CONTEXT_LENGTH=70000 as there.
set -u
source .device/prelude.sh
O=$OUT; M=/root/m-spread; mkdir -p ~/.cache/huggingface/hub; export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_CONTEXT_LENGTH=70000
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit); cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
[ -f $M/config.json ] || timeout 200 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null 2>&1; echo "model at ${SECONDS}s"
(cd bench && timeout $((590 - SECONDS)) python3 turbo_bench.py --model $M --mlx-serve $B/mlx-serve --python python3 \
  --out "$O/a3b-turbo-streams16-32768-fp16.json" --gen-tokens 128 --runs 1 --configs fp16 --streams 16 --contexts 32768 \
  --warm-context 2048) 2>&1 | tee "$O/a3b-turbo-streams16-32768-fp16.txt" | grep -E "^\[|^\|"
echo "ended at ${SECONDS}s"
