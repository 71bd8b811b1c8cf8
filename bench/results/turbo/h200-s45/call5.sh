#!/usr/bin/env bash
# Session 45 call 5 (binary 09dd6d1): the whole Llama-3.1-8B-shaped model (4-bit, random weights)
# at 64K with the attention block target calls 3-4 chose (MLX_SERVE_TURBO_BLOCKS=448: 480 blocks,
# 61 µs a launch against 72 at 256) and with the old default (256), each in one process with the
# 16-bit cache pass by pass (decode_step; the 16-bit cache's attention does not read the target);
# then turbo_bench.py at 64K with 448, as long as time is left.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=$OUT; mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader
[ -f /root/llama/config.json ] || timeout 90 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
timeout 120 $B/mlx-serve generate --model /root/llama --prompt "hello there" --max-tokens 8 --ignore-chat-template > /dev/null 2>&1
echo "warm-up at ${SECONDS}s"
for blocks in 448 256; do
  MLX_SERVE_TURBO_BLOCKS=$blocks timeout 170 $B/decode_step /root/llama --rows 1 --prompt 65536 --warm-prompt 4096 --steps 64 \
    --passes 3 --turbo-kv fp16,balanced --engine-loop > "$O/decode-step-64k-blocks$blocks.txt" 2>&1
  echo "decode_step blocks $blocks rc $? at ${SECONDS}s"; tail -12 "$O/decode-step-64k-blocks$blocks.txt"
done
left=$(( 515 - SECONDS ))
(cd bench && MLX_SERVE_TURBO_BLOCKS=448 timeout $left python3 turbo_bench.py --model /root/llama --mlx-serve $B/mlx-serve \
  --python python3 --out "$O/turbo-64k-blocks448.json" --gen-tokens 128 --runs 1 --contexts 65536 --configs fp16,balanced) \
  > "$O/turbo-64k-blocks448.txt" 2>&1
echo "turbo_bench rc $? at ${SECONDS}s"; tail -4 "$O/turbo-64k-blocks448.txt"
