#!/usr/bin/env bash
# Session 35 call 3: the HTTP server against mlx_lm.server on the Llama-3.1-8B shape,
# 4-bit, 1 and 8 streams (bench/server_bench.py), with the quantized-matmul kernel's
# fused forms on (the default).
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
date +%T
timeout 330 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
date +%T
left=$(( 585 - SECONDS ))
echo "server_bench with ${left} s left"
timeout $left python3 bench/server_bench.py --model /tmp/llama --mlx-serve "$B/mlx-serve" --python python3 \
  --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --label "$(cat .device/commit) fused" \
  --out "$O/server-llama-3.1-8b-4bit.json" > "$O/server-bench.txt" 2>&1
echo "server_bench rc $?"
date +%T
# With time left: the 16-bit cache against balanced at a 4K prompt, fused forms on (issue 19).
left=$(( 585 - SECONDS ))
if [ $left -gt 90 ]; then
  timeout $(( left - 10 )) "$B/decode_step" /tmp/llama --rows 1 --prompt 4096 --steps 64 --passes 3 --turbo-kv fp16,balanced > "$O/llama-4k-turbo.txt" 2>&1
  echo "decode_step rc $?"
fi
date +%T
grep -E "^\|   \| 1 row" "$O/llama-4k-turbo.txt" 2>/dev/null
tail -n 45 "$O/server-bench.txt"
