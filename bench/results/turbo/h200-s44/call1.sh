#!/usr/bin/env bash
# Session 44 call 1 (binary 09dd6d1): issue 19 on the Llama-3.1-8B shape (4-bit, random weights)
# with every kernel and fused form on main: `balanced` against the 16-bit cache at 64K and 32K
# through `mlx-serve generate` (turbo_bench.py; the prefill's 2048-token chunks on a GPU since
# session 42), then both in one process, pass by pass, at 64K (decode_step).
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=$OUT; mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep "Model name"
[ -f /root/llama/config.json ] || timeout 90 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
timeout 120 $B/mlx-serve generate --model /root/llama --prompt "hello there" --max-tokens 8 --ignore-chat-template > /dev/null 2>&1
echo "warm-up at ${SECONDS}s"
tb() { # tag limit args...
  local tag=$1 limit=$2; shift 2
  (cd bench && timeout $limit python3 turbo_bench.py --model /root/llama --mlx-serve $B/mlx-serve --python python3 \
    --out "$O/turbo-$tag.json" --gen-tokens 128 --runs 1 "$@") > "$O/turbo-$tag.txt" 2>&1
  echo "turbo $tag rc $? at ${SECONDS}s"; tail -4 "$O/turbo-$tag.txt"
}
tb 64k 150 --contexts 65536 --configs fp16,balanced
tb 32k 100 --contexts 32768 --configs fp16,balanced
left=$(( 570 - SECONDS ))
echo "decode_step with ${left}s left"
timeout $left $B/decode_step /root/llama --rows 1 --prompt 65536 --warm-prompt 4096 --steps 64 --passes 3 \
  --turbo-kv fp16,balanced --engine-loop > "$O/decode-step-64k.txt" 2>&1
echo "decode_step rc $? at ${SECONDS}s"; tail -15 "$O/decode-step-64k.txt"
