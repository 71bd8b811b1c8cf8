#!/usr/bin/env bash
# Session 51 call 1 (binary at HEAD, `scripts/device-bundle.sh --bench`), a fresh H200: issue 15's
# MoE router kernel run on a GPU for the first time: its test against MLX's ops (432 routings),
# then decode_step on the Qwen3-30B-A3B shape (4-bit, random weights) at 1 and 8 rows with
# MLX_SERVE_ROUTER_KERNEL=0 and 1 in turn, twice (`bench/quant_kernel_gpu.sh router`).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MODELS=/root/models OUT=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
timeout 580 bash bench/quant_kernel_gpu.sh router 2>&1 | tee "$OUT/router.txt"
echo "ended at ${SECONDS}s"
