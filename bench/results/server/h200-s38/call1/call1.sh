#!/usr/bin/env bash
# Session 38 call 1: where a burst's prefill time goes. The server alone (38e9ce3), 8 streams,
# Llama-3.1-8B shape 4-bit, debug log: each prefill chunk's eval time and its buffer-cache clear.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
date +%T
timeout 240 python3 bench/server_bench.py --model /tmp/llama --mlx-serve $B/mlx-serve --python python3 --no-ref \
    --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --label debug \
    --ours-args "--log-level debug" --out "$O/debug.json" > "$O/debug.txt" 2>&1
echo "rc $? $(date +%T)"
cp /tmp/server-bench-*/*.log "$O/" 2>/dev/null
ls /tmp/server-bench-*/
L=$(ls /tmp/server-bench-*/*.log | head -1)
echo "== prefill chunks (wait ms, clear ms): count $(grep -c 'prefill chunk' $L)"
grep 'prefill chunk' $L | sed -E 's/.*waited ([0-9.]+) ms.* in ([0-9.]+) ms/\1 \2/' | tail -40 | tr '\n' ';'
echo
grep -E "^\| (1|8) \|" "$O/debug.txt"; grep -E "^\| (TTFT \(ms\)|aggregate tok/s) " "$O/debug.txt"
