#!/usr/bin/env bash
# Session 46 call 4 (binary 4ee3d51-dirty: the byte-index attention kernel built in): call 2's
# 4 rows x 64K again with 3 passes (Llama-3.1-8B shape, 4-bit, random weights; decode_step, both
# caches pass by pass in one process, engine loop).
set -u
source .device/prelude.sh
O=$OUT
[ -f /root/llama/config.json ] || timeout 90 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
timeout $(( 380 - SECONDS )) $B/decode_step /root/llama --rows 4 --prompt 65536 --warm-prompt 4096 --steps 32 \
  --passes 3 --turbo-kv fp16,balanced --engine-loop > "$O/decode-step-64k-rows4.txt" 2>&1
echo "rows 4 rc $? at ${SECONDS}s"; grep -E "^\| 4 |median|rror" "$O/decode-step-64k-rows4.txt"
