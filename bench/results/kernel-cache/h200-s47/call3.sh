#!/usr/bin/env bash
# Session 47 call 3 (binary 17d106f): server starts on the Llama-3.1-8B shape (4-bit, random
# weights), 16-bit cache then `--turbo-kv balanced`, each: two starts with compile-once, then
# one with it off (MLX_SERVE_KERNEL_CACHE=0), one kernel cache folder throughout; then issue
# 19's 4 streams x 32K cell through the server (turbo_bench.py, 2048-token warm-up wave).
set -u
source .device/prelude.sh
O=$OUT; mkdir -p ~/.cache/huggingface/hub
export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
[ -f /root/llama/config.json ] || timeout 120 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
timeout 200 python3 bench/start_probe.py --model /root/llama --mlx-serve $B/mlx-serve --starts 2 --off --ptx-dir /root/ptx 2>&1 | tee "$O/start-probe-llama-fp16.txt"
echo "fp16 probe ended at ${SECONDS}s"
timeout 150 python3 bench/start_probe.py --model /root/llama --mlx-serve $B/mlx-serve --flags "--turbo-kv balanced" --starts 2 --off --ptx-dir /root/ptx 2>&1 | tee "$O/start-probe-llama-balanced.txt"
echo "balanced probe ended at ${SECONDS}s"
for f in /tmp/start-probe-*/mlx-serve-*.log; do echo "== $f"; grep -E "warmed up|CUDA kernels|COMPILE|ERROR|WARN" "$f" | cut -c1-300 | head -5; done
(cd bench && timeout $((590 - SECONDS)) python3 turbo_bench.py --model /root/llama --mlx-serve $B/mlx-serve --python python3 \
  --out "$O/turbo-streams4-32k.json" --gen-tokens 128 --runs 1 --configs fp16,balanced --streams 4 --contexts 32768 \
  --warm-context 2048) 2>&1 | tee "$O/turbo-streams4-32k.txt" | grep -E "^\[|^\|"
echo "turbo ended at ${SECONDS}s"
