#!/usr/bin/env bash
# Session 56 call 1 (binary e7444c5): where one stream's host time goes inside MLX, by function:
# decode_step's timed pass sampled 997 times a second of CPU time (--host-profile), first on the
# Llama-3.1-8B 4-bit shape (session 55 call 5's script, not run there), then on Qwen3-30B-A3B's.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
M=/root/models/llama
python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama built at ${SECONDS}s"
timeout 240 $B/decode_step $M --rows 1 --prompt 32 --steps 48 --passes 1 --host-profile 997 > $OUT/llama-profile.txt 2>&1
echo "llama rc=$? at ${SECONDS}s"
A=/root/models/a3b
timeout 150 python3 bench/make_moe_model.py qwen3-30b-a3b $A > /dev/null 2>&1; echo "a3b built rc=$? at ${SECONDS}s"
timeout $((585 - SECONDS)) $B/decode_step $A --rows 1 --prompt 32 --steps 24 --passes 1 --host-profile 997 > $OUT/a3b-profile.txt 2>&1
echo "a3b rc=$? at ${SECONDS}s"
