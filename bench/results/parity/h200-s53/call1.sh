#!/usr/bin/env bash
# Session 53 call 1 (binary d0a253a): the two expert_streaming tests not yet run on CUDA as
# changed in session 52: the byte-count test (its server's first start on a fresh machine
# compiles MLX's kernels and ours; the harness waits 600 s on CUDA) and the speculative-read
# failure test (up to four prompts until the failing read is a decode step's).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve
mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
one() {  # TEST LIMIT
  timeout $2 $B/expert_streaming --exact $1 --test-threads 1 --nocapture > $OUT/$1.txt 2>&1
  if grep -q "test result: ok. 1 passed" $OUT/$1.txt; then echo "ok     $1 (${SECONDS}s)"
  else echo "FAILED $1 (${SECONDS}s)"; grep -E -A2 "panicked" $OUT/$1.txt | head -6; fi
}
one every_expert_byte_is_counted_and_the_kernel_counts_the_same_reads 330
one a_read_failing_in_a_speculative_step_fails_the_request_and_serving_goes_on 230
grep -h "misses,\|prompt [0-9]:\|bytes" $OUT/*.txt | head -30
echo "ended at ${SECONDS}s"
