#!/usr/bin/env bash
# Session 38 call 5: long prompts' prefill with a prompt's products on the tensor cores (c359b09),
# in 512- and 2048-token chunks, beside mlx-lm at the same chunk size: bench/generate_bench.py,
# Llama-3.1-8B shape 4-bit, prompts of 4096 and 16384 tokens, 16 generated, 1 run each.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
date +%T
gb() { # prompt prefill limit
  timeout $3 python3 bench/generate_bench.py --model /tmp/llama --mlx-serve $B/mlx-serve --prompt-tokens $1 \
    --gen-tokens 16 --prefill-size $2 --runs 1 --out "$O/p$1-c$2.json" > "$O/p$1-c$2.txt" 2>&1
  echo "p$1 c$2 rc $? $(date +%T)"
}
gb 4096 512 200
gb 4096 2048 100
left=$(( 480 - SECONDS )); echo "left $left"
[ $left -gt 120 ] && gb 16384 2048 $(( left - 10 ))
left=$(( 480 - SECONDS )); echo "left $left"
[ $left -gt 90 ] && gb 16384 512 $(( left - 5 ))
for f in "$O"/p*.txt; do echo "== $(basename $f)"; grep -E "prompt tok/s|TTFT|generation tok/s|peak" "$f" | head -6; done
