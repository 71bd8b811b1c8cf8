#!/usr/bin/env bash
# Session 54 call 1 (binary 5d212b1, a fresh machine: the 4-bit fixture built here first, the
# kernels compiled at the server's first start): the speculative-read failure test as fixed in
# 9e728fd (--prompt-concurrency 1, the damaged request's prefill asserted to come from the
# prompt cache), then the byte-count test on the warm machine.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve
mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
one() {  # TEST LIMIT
  timeout $2 $B/expert_streaming --exact $1 --test-threads 1 --nocapture > $OUT/$1.txt 2>&1
  if grep -q "test result: ok. 1 passed" $OUT/$1.txt; then echo "ok     $1 (${SECONDS}s)"
  else echo "FAILED $1 (${SECONDS}s)"; grep -E -A4 "panicked" $OUT/$1.txt | head -8; fi
}
one a_read_failing_in_a_speculative_step_fails_the_request_and_serving_goes_on 480
grep -h "prompt [0-9]:\|cache\|step" $OUT/a_read*.txt | head -20
echo "ended at ${SECONDS}s"
