#!/usr/bin/env bash
# Session 53 call 3 (binary d0a253a, the machine of calls 1-2 kept warm: the fixture built and
# the kernels compiled): the byte-count test again, whole (call 1's 330 s limit had cut it while
# it built the 4-bit fixture and its server's first start compiled the kernels).
source .device/prelude.sh; export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve; mkdir -p ~/.cache/huggingface/hub; echo "binary $(cat .device/commit)"; timeout 500 $B/expert_streaming --exact every_expert_byte_is_counted_and_the_kernel_counts_the_same_reads --test-threads 1 --nocapture > $OUT/bytes.txt 2>&1; echo rc=$? at ${SECONDS}s; grep -E "misses,|test result|panicked" -A2 $OUT/bytes.txt | head
