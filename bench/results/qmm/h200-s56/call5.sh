#!/usr/bin/env bash
# Session 56 call 5 (binary 585e027): the Qwen3-30B-A3B shape's one row with --direct on,off again
# (call 2's passes drifted), on the same machine (its model built by call 2), four passes.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
date -u; echo "binary $(cat .device/commit)"
A=/root/models/a3b; ls $A/config.json || exit 1
timeout 170 $B/decode_step $A --rows 1 --prompt 32 --steps 32 --passes 4 --direct on,off > $OUT/a3b-direct.txt 2>&1
echo "a3b rc=$? at ${SECONDS}s"; grep -E "median|^\| [0-9]" $OUT/a3b-direct.txt
