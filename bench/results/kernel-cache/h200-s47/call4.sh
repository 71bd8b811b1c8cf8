#!/usr/bin/env bash
# Session 47 call 4 (binary 17d106f; bench/start_probe.py's --off as committed after it):
# the Llama-3.1-8B shape (4-bit, random weights) on a fresh machine: two server starts with
# compile-once, then one as before it (MLX's own kernels cached, ours not, compile-once off);
# then issue 19's 4 streams x 64K and 16 streams x 32K cells through the server
# (turbo_bench.py, 2048-token warm-up wave).
set -u
source .device/prelude.sh
O=$OUT; mkdir -p ~/.cache/huggingface/hub
export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
[ -f /root/llama/config.json ] || timeout 120 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
timeout 240 python3 bench/start_probe.py --model /root/llama --mlx-serve $B/mlx-serve --starts 2 --off --ptx-dir /root/ptx 2>&1 | tee "$O/start-probe-llama-fp16.txt"
echo "fp16 probe ended at ${SECONDS}s"
for f in /tmp/start-probe-*/mlx-serve-*.log; do echo "== $f"; grep -E "warmed up|CUDA kernels|MLX_SERVE_KERNEL_CACHE|ERROR|WARN" "$f" | cut -c1-300 | head -5; done
for cell in "4 65536" "16 32768"; do
  set -- $cell
  left=$((560 - SECONDS)); [ $left -lt 60 ] && { echo "no time for $1 x $2"; continue; }
  (cd bench && timeout $left python3 turbo_bench.py --model /root/llama --mlx-serve $B/mlx-serve --python python3 \
    --out "$O/turbo-streams$1-$2.json" --gen-tokens 128 --runs 1 --configs fp16,balanced --streams $1 --contexts $2 \
    --warm-context 2048) 2>&1 | tee "$O/turbo-streams$1-$2.txt" | grep -E "^\[|^\|"
  echo "$1 x $2 ended at ${SECONDS}s"
done
