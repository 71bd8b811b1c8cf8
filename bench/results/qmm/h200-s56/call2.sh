#!/usr/bin/env bash
# Session 56 call 2 (binary of the commit in .device/commit): direct calls of CUDA custom kernel
# instances (mlx-rs-safe kernel_direct). First the quantized-matmul kernel's tests against MLX
# (every call after an instance's first now goes direct; later_calls_go_direct_and_agree checks
# the count and inputs of other dimension counts), then decode_step with --direct on,off in one
# process: Llama-3.1-8B 4-bit at 1 and 8 rows, then the Qwen3-30B-A3B shape at 1 row.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
M=/root/models/llama
python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama built at ${SECONDS}s"
timeout 200 $B/quant_kernel --test-threads 16 later_calls dense_matches normed_forms residual_form gated_dense gathered_matches > $OUT/tests.txt 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^test |test result|panicked" $OUT/tests.txt | head -20
timeout 200 $B/decode_step $M --rows 1,8 --prompt 32 --steps 64 --passes 3 --direct on,off > $OUT/llama-direct.txt 2>&1
echo "llama rc=$? at ${SECONDS}s"; grep -E "median|^\| [0-9]" $OUT/llama-direct.txt
A=/root/models/a3b
timeout 100 python3 bench/make_moe_model.py qwen3-30b-a3b $A > /dev/null 2>&1; echo "a3b built rc=$? at ${SECONDS}s"
timeout $((580 - SECONDS)) $B/decode_step $A --rows 1 --prompt 32 --steps 32 --passes 3 --direct on,off > $OUT/a3b-direct.txt 2>&1
echo "a3b rc=$? at ${SECONDS}s"; grep -E "median|^\| [0-9]" $OUT/a3b-direct.txt
