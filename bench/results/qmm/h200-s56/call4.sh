#!/usr/bin/env bash
# Session 56 call 4 (binary 585e027): call 3's quantized-matmul tests that ran out of time
# (compiling their instances), again on the same machine, its kernel cache now warm.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
date -u; echo "binary $(cat .device/commit); cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
timeout 280 $B/quant_kernel --test-threads 16 matches_mlx matches_separate normed_forms residual_form > $OUT/quant_kernel.txt 2>&1
echo "quant_kernel rc=$? at ${SECONDS}s"; grep -E "^test |test result|panicked" $OUT/quant_kernel.txt | head -30
