#!/usr/bin/env bash
# Session 38 call 2: a prompt's quantized matmuls on the H200, MLX's quantized_matmul against
# dequantize + matmul, Llama-3.1-8B shapes, 4-bit (group 64 and 32) and 8-bit.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
O=${OUT:-/tmp/out}; mkdir -p "$O"
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; git log -1 --format=%h 2>/dev/null; } | tee "$O/machine.txt"
date +%T
timeout 200 python3 bench/prefill_matmul_probe.py > "$O/q4g64.txt" 2>&1; echo "rc $? $(date +%T)"
timeout 100 python3 bench/prefill_matmul_probe.py --rows 16,64,143,512,1144 --group-size 32 > "$O/q4g32.txt" 2>&1; echo "rc $? $(date +%T)"
timeout 100 python3 bench/prefill_matmul_probe.py --rows 16,64,143,512,1144 --bits 8 > "$O/q8g64.txt" 2>&1; echo "rc $? $(date +%T)"
for f in q4g64 q4g32 q8g64; do echo "== $f"; grep -v "^| ---" "$O/$f.txt" | tail -45; done
