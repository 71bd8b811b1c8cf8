#!/usr/bin/env bash
# Session 44 call 3 (binary 09dd6d1): issue 19 on the Qwen3-30B-A3B shape (4-bit, random weights;
# the model call 2 built, make_moe_model.py --embed-scale 100, resident): `balanced` against the
# 16-bit cache at 32K and 64K through `mlx-serve generate`, then in one process at 32K.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1 M=/root/m-spread
O=$OUT; mkdir -p ~/.cache/huggingface/hub
[ -f $M/config.json ] || timeout 90 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null; echo "model at ${SECONDS}s"
tb() { local tag=$1 limit=$2; shift 2
  (cd bench && timeout $limit python3 turbo_bench.py --model $M --mlx-serve $B/mlx-serve --python python3 \
    --out "$O/a3b-turbo-$tag.json" --gen-tokens 128 --runs 1 "$@") > "$O/a3b-turbo-$tag.txt" 2>&1
  echo "turbo $tag rc $? at ${SECONDS}s"; tail -3 "$O/a3b-turbo-$tag.txt"; }
tb 32k 170 --contexts 32768 --configs fp16,balanced
tb 64k 220 --contexts 65536 --configs fp16,balanced
left=$(( 575 - SECONDS ))
echo "decode_step with ${left}s left"
timeout $left $B/decode_step $M --rows 1 --prompt 32768 --warm-prompt 4096 --steps 64 --passes 3 \
  --turbo-kv fp16,balanced --engine-loop > "$O/a3b-decode-step-32k.txt" 2>&1
echo "decode_step rc $? at ${SECONDS}s"; tail -12 "$O/a3b-decode-step-32k.txt" | cut -c1-250
