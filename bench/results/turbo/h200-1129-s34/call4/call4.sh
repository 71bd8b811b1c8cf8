#!/usr/bin/env bash
# Session 34 call 4: the fixed fallback test of server/tests/quant_kernel.rs on
# CUDA, then ncu GPU time per kernel at 4K (turbo_attend_bounded; call 1's 4K
# table was cut from the console's tail).
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; cat .device/commit; date +%T
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
timeout 60 $B/quant_kernel --exact unsupported_calls_fall_back --nocapture 2>&1 | grep -E "test result|panicked|assert"
date +%T
timeout 150 ncu --csv --metrics gpu__time_duration.sum --print-units base $B/kv_attend --contexts 4096 --formats fp16,balanced --layers 4 --steps 3 --kv-heads 4 --heads 32 > /tmp/ncu.csv 2>/tmp/ncu.err || tail -3 /tmp/ncu.err
python3 bench/ncu_times.py /tmp/ncu.csv | grep -E "kernel \||turbo_attend|turbo_encode_step|cudnn" 
date +%T
date +%T
