#!/usr/bin/env bash
# Session 49 call 3 (binary cd53907), the machine of calls 1-2: issue 19's 16 streams x 32K cell on the
# Qwen3-30B-A3B shape (4-bit, random weights, resident) through the server, the 16-bit cache alone in this call (call 4:
# `balanced`). The shape's config says 40960 positions (as Qwen3-30B-A3B's does without YaRN), so
# both servers run with MLX_SERVE_CONTEXT_LENGTH=70000 (`--context-length`).
set -u
source .device/prelude.sh
O=$OUT; M=/root/m-spread; mkdir -p ~/.cache/huggingface/hub; export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_CONTEXT_LENGTH=70000
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
[ -f $M/config.json ] || timeout 200 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null 2>&1; echo "model at ${SECONDS}s"
(cd bench && timeout $((585 - SECONDS)) python3 turbo_bench.py --model $M --mlx-serve $B/mlx-serve --python python3 \
  --out "$O/a3b-turbo-streams16-32768-fp16.json" --gen-tokens 128 --runs 1 --configs fp16 --streams 16 --contexts 32768 \
  --warm-context 2048) 2>&1 | tee "$O/a3b-turbo-streams16-32768-fp16.txt" | grep -E "^\[|^\|"
echo "ended at ${SECONDS}s"
