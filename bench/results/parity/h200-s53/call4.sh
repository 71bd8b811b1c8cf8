#!/usr/bin/env bash
# Session 53 call 4 (binary 9fd25fe): the speculative-read failure test as changed after call 1
# (each prompt answered in one token first, the damaged request's tokens sampled), on a
# fresh machine (the 4-bit fixture built here first, the kernels compiled at the server's first start).
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
one a_read_failing_in_a_speculative_step_fails_the_request_and_serving_goes_on 560
grep -h "misses,\|prompt [0-9]:\|bytes" $OUT/*.txt | head -30
echo "ended at ${SECONDS}s"
