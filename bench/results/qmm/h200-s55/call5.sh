#!/usr/bin/env bash
# Session 55 call 5 (binary 1bc4624): where one Llama-3.1-8B stream's host time goes inside MLX,
# by function: decode_step's timed pass sampled 997 times a second of CPU time (--host-profile).
# The session's last ~260 s of device time: short passes, output written as it comes.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
M=/root/models/llama
python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "model built at ${SECONDS}s"
$B/decode_step $M --rows 1 --prompt 32 --steps 48 --passes 1 --host-profile 997 > $OUT/profile.txt 2>&1
echo "rc=$? at ${SECONDS}s"; head -c 9000 $OUT/profile.txt
