#!/usr/bin/env bash
# Session 44 call 6 (binary 09dd6d1): `--kv-bits 8` (read as codes by a kernel since 7fda032)
# beside the 16-bit cache and `balanced` at 32K, Llama-3.1-8B shape 4-bit, one stream.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=$OUT; mkdir -p ~/.cache/huggingface/hub
[ -f /root/llama/config.json ] || timeout 90 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
timeout 100 $B/mlx-serve generate --model /root/llama --prompt "hello there" --max-tokens 8 --ignore-chat-template > /dev/null 2>&1
echo "warm-up at ${SECONDS}s"
left=$(( 270 - SECONDS ))
(cd bench && timeout $left python3 turbo_bench.py --model /root/llama --mlx-serve $B/mlx-serve --python python3 \
  --out "$O/turbo-32k-kv8.json" --gen-tokens 128 --runs 1 --contexts 32768 --configs fp16,kv8,balanced) > "$O/turbo-32k-kv8.txt" 2>&1
echo "turbo rc $? at ${SECONDS}s"; tail -5 "$O/turbo-32k-kv8.txt"
