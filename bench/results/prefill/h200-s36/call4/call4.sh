#!/usr/bin/env bash
# Session 36 call 4: the HTTP server against mlx_lm.server on the Llama-3.1-8B shape, 4-bit,
# 1 and 8 streams (bench/server_bench.py, as session 35's call 3), with this session's prefill
# changes on (the defaults); then, with time left, call 3's missing cell (ab.py, prompts of
# new lengths, 2000 tokens x 8 streams, before/after switches on one binary).
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
printf '#!/bin/sh\nMLX_SERVE_UNFUSED_PREFILL_KEYS=0 exec "%s/mlx-serve" "$@" --prompt-concurrency 1\n' "$B" > "$B/base"
printf '#!/bin/sh\nexec "%s/mlx-serve" "$@"\n' "$B" > "$B/new"
chmod +x "$B/base" "$B/new"
date +%T
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
date +%T
limit=${CALL_LIMIT:-540}
left=$(( limit - SECONDS ))
echo "server_bench with ${left} s left"
timeout $left python3 bench/server_bench.py --model /tmp/llama --mlx-serve "$B/mlx-serve" --python python3 \
  --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --label "$(cat .device/commit)" \
  --out "$O/server-llama-3.1-8b-4bit.json" > "$O/server-bench.txt" 2>&1
echo "server_bench rc $?"; date +%T
left=$(( limit - SECONDS ))
if [ $left -gt 150 ]; then
  timeout $(( left - 5 )) python3 bench/ab.py --model /tmp/llama --build base="$B/base" --build new="$B/new" --configs default \
    --contexts 2000 --concurrency 8 --gen-tokens 64 --repeats 1 --new-lengths --out "$O/ab.json" > "$O/ab.txt" 2> "$O/ab-log.txt"
  echo "ab rc $?"; date +%T
  grep -E "tok/s" "$O/ab-log.txt" | cut -c1-160
fi
tail -n 45 "$O/server-bench.txt"
