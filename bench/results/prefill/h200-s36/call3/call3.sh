#!/usr/bin/env bash
# Session 36 call 3: through the server, prompts of lengths it has not seen (as served prompts
# are), the build before this session's prefill changes ("base": MLX_SERVE_UNFUSED_PREFILL_KEYS=0,
# --prompt-concurrency 1) against the new defaults (composed attention for prefill chunks over
# up to 8192 keys on CUDA, whole prompts admitted together prefilled in one call), one binary,
# one streaming client (bench/ab.py --new-lengths), Llama-3.1-8B shape 4-bit.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O"
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
printf '#!/bin/sh\nMLX_SERVE_UNFUSED_PREFILL_KEYS=0 exec "%s/mlx-serve" "$@" --prompt-concurrency 1\n' "$B" > "$B/base"
printf '#!/bin/sh\nexec "%s/mlx-serve" "$@"\n' "$B" > "$B/new"
chmod +x "$B/base" "$B/new"
date +%T
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -n 5 /tmp/llama-build.txt
date +%T
timeout ${AB_LIMIT:-470} python3 bench/ab.py --model /tmp/llama --build base="$B/base" --build new="$B/new" --configs default \
  --contexts 128,2000 --concurrency 1,8 --gen-tokens 64 --repeats 1 --new-lengths --out "$O/ab.json" > "$O/ab.txt" 2> "$O/ab-log.txt"
echo "ab rc $?"; date +%T
tail -n 15 "$O/ab-log.txt" | cut -c1-200
cat "$O/ab.txt"
