#!/usr/bin/env bash
# Session 44 call 2 (binary 09dd6d1): issue 11's `graphs` stage, never run: traced 75% decode runs
# of the Qwen3-30B-A3B shape whose routing spreads with MLX's CUDA graphs on and off. Is the
# ~0.6 ms a router read-back still takes at 75% (session 43) MLX's CUDA graph per evaluation?
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=$OUT
timeout 560 env OUT=$O bash bench/expert_gpu.sh warm graphs > $O/graphs.txt 2>&1
echo "expert_gpu rc $? at ${SECONDS}s"
for f in $O/readback-graphs*.log; do [ -f $f ] && xz -T4 $f; done
cat $O/graphs.txt | cut -c1-400
