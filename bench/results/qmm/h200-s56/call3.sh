#!/usr/bin/env bash
# Session 56 call 3 (binary 585e027): every CUDA custom kernel's tests with direct calls (each
# instance's calls after its first): the quantized-matmul kernel's tests against MLX, and the
# library's unit tests (attention, TurboQuant, router and gated-delta kernels), side by side.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub
date -u; echo "binary $(cat .device/commit); cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
(timeout 520 $B/quant_kernel --test-threads 16 > $OUT/quant_kernel.txt 2>&1; echo "quant_kernel rc=$? at ${SECONDS}s") &
(timeout 520 $B/mlx_serve_lib --test-threads 8 > $OUT/lib.txt 2>&1; echo "lib rc=$? at ${SECONDS}s") &
wait
grep -E "test result|FAILED|panicked" $OUT/quant_kernel.txt $OUT/lib.txt | head -30
