#!/usr/bin/env bash
# Session 36 call 2: what prompt shapes not seen before cost on CUDA, and whether cuDNN's
# attention plans (MLX caches one per exact q/k shape and strides) are that cost: short
# prompts of new lengths, and long prompts prefilled in 512-token chunks into a reserved
# cache, twice each, with MLX's cuDNN attention on and then off (bench/prefill_probe.py).
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
O=${OUT:-/tmp/out}; mkdir -p "$O"
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; git log -1 --format=%h 2>/dev/null; } | tee "$O/machine.txt"
date +%T
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -n 5 /tmp/llama-build.txt
date +%T
L=4096,4096,4000,8192,8192,7900
for cudnn in 1 0; do
  MLX_CUDA_USE_CUDNN_SDPA=$cudnn timeout 240 python3 bench/prefill_probe.py /tmp/llama --rows 1,8 --lengths 128 --reps 3 --new-shapes 4 --chunked $L --chunk 512 > "$O/cudnn$cudnn.txt" 2>&1
  echo "cudnn=$cudnn rc $?"; date +%T
done
for f in cudnn1 cudnn0; do echo "== $f"; grep -E "^\|" "$O/$f.txt" | grep -v -- "---"; done
