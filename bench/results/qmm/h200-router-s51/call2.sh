#!/usr/bin/env bash
# Session 51 call 2, the machine of call 1 kept warm: issue 15's server stage with today's
# kernels (dense_attend's lane loop, the router kernel): the Llama-3.1-8B shape (4-bit, random
# weights), 1 and 8 streams of 128 prompt and 128 generated tokens, mlx-serve beside
# mlx_lm.server (`bench/quant_kernel_gpu.sh server`; the goal: 8 streams' aggregate >= 5x one's).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MODELS=/root/models OUT=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
timeout 580 bash bench/quant_kernel_gpu.sh server 2>&1 | tee "$OUT/server.txt"
echo "ended at ${SECONDS}s"
