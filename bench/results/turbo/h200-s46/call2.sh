#!/usr/bin/env bash
# Session 46 call 2 (binary 4ee3d51-dirty: the byte-index attention kernel built in): the whole
# Llama-3.1-8B-shaped model (4-bit, random weights) at 64K, the 16-bit cache and balanced pass
# by pass in one process (decode_step, engine loop), 1 row and 4 rows (rows of one length).
set -u
source .device/prelude.sh
O=$OUT; mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader
[ -f /root/llama/config.json ] || timeout 90 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
timeout 120 $B/mlx-serve generate --model /root/llama --prompt "hello there" --max-tokens 8 --ignore-chat-template > /dev/null 2>&1
echo "warm-up at ${SECONDS}s"
timeout 170 $B/decode_step /root/llama --rows 1 --prompt 65536 --warm-prompt 4096 --steps 64 \
  --passes 3 --turbo-kv fp16,balanced --engine-loop > "$O/decode-step-64k-rows1.txt" 2>&1
echo "rows 1 rc $? at ${SECONDS}s"; grep -E "^\| 1 |median" "$O/decode-step-64k-rows1.txt"
timeout $(( 545 - SECONDS )) $B/decode_step /root/llama --rows 4 --prompt 65536 --warm-prompt 4096 --steps 32 \
  --passes 2 --turbo-kv fp16,balanced --engine-loop > "$O/decode-step-64k-rows4.txt" 2>&1
echo "rows 4 rc $? at ${SECONDS}s"; grep -E "^\| 4 |median|rror" "$O/decode-step-64k-rows4.txt"
