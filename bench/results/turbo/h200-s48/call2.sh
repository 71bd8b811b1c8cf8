#!/usr/bin/env bash
# Session 48 call 2 (binary 2ae480d): issue 19 on the Qwen3-30B-A3B shape (4-bit, random weights,
# make_moe_model.py --embed-scale 100, resident): the whole model at 4 rows x 32K and 4 rows x 64K,
# 16-bit cache against `balanced` in one process, pass by pass (decode_step).
set -u
source .device/prelude.sh
O=$OUT; M=/root/m-spread; export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
[ -f $M/config.json ] || timeout 200 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null 2>&1; echo "model at ${SECONDS}s"
for p in 32768 65536; do
  left=$((585 - SECONDS)); [ $left -lt 60 ] && { echo "no time for $p"; continue; }
  timeout $left $B/decode_step $M --rows 4 --prompt $p --warm-prompt 4096 --steps 32 --passes 2 \
    --turbo-kv fp16,balanced --engine-loop > "$O/a3b-decode-step-4x$p.txt" 2>&1
  echo "4 x $p: rc $? at ${SECONDS}s"; tail -14 "$O/a3b-decode-step-4x$p.txt" | cut -c1-260
done
