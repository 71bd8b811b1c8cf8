#!/usr/bin/env bash
# Session 46 call 3 (binary 4ee3d51-dirty: the byte-index attention kernel built in): the
# Llama-3.1-8B-shaped model (4-bit, random weights) through the server, 4 streams at 64K and 32K
# (turbo_bench.py: 4 chat requests at once; tok/s = aggregate decode while all 4 decode), then
# decode_step at 4 rows x 32K, both caches pass by pass in one process, as long as time is left.
set -u
source .device/prelude.sh
O=$OUT; mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader
[ -f /root/llama/config.json ] || timeout 90 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
tb() { local tag=$1 limit=$2; shift 2
  (cd bench && timeout $limit python3 turbo_bench.py --model /root/llama --mlx-serve $B/mlx-serve --python python3 \
    --out "$O/turbo-$tag.json" --gen-tokens 128 --runs 1 --configs fp16,balanced "$@") > "$O/turbo-$tag.txt" 2>&1
  echo "turbo $tag rc $? at ${SECONDS}s"; grep -E "^\[|^\|" "$O/turbo-$tag.txt" | tail -6; }
tb streams4-64k 260 --streams 4 --contexts 65536
tb streams4-32k 150 --streams 4 --contexts 32768
left=$(( 545 - SECONDS ))
echo "decode_step with ${left}s left"
timeout $left $B/decode_step /root/llama --rows 4 --prompt 32768 --warm-prompt 4096 --steps 32 \
  --passes 2 --turbo-kv fp16,balanced --engine-loop > "$O/decode-step-32k-rows4.txt" 2>&1
echo "rows 4 rc $? at ${SECONDS}s"; grep -E "^\| 4 |median|rror" "$O/decode-step-32k-rows4.txt"
