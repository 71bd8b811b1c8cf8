#!/usr/bin/env bash
# Session 52 call 4 (binary 792804f): the expert_streaming tests of call 3 that failed, again:
# the speculative-read failure now at a 50% cache, the memory test with CUDA's runtime RSS taken
# out, and the byte-count test alone (its server did not start in 120 s in call 3, beside two
# other tests compiling CUDA kernels on a fresh machine). Then gemma3_bf16 step by step: which
# step's log-probability first differs from mlx-lm's (gemma3_steps.py).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve MLX_ENABLE_TF32=0
mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
one() {  # one BIN TEST
  timeout 300 $B/$1 --exact $2 --test-threads 1 --nocapture > $OUT/$2.txt 2>&1
  if grep -q "test result: ok. 1 passed" $OUT/$2.txt; then echo "ok     $2 (${SECONDS}s)"
  else echo "FAILED $2 (${SECONDS}s)"; grep -E -A2 "panicked" $OUT/$2.txt | head -6; fi
}
( unset MLX_ENABLE_TF32; one parity gemma3_bf16_with_sliding_window_shorter_than_the_prompt_matches_mlx_lm
  python3 bench/results/parity/h200-s52/gemma3_steps.py $PWD/target/tmp/parity/gemma3_bf16 $B/mlx-serve > $OUT/gemma3_steps.txt 2>&1
  tail -45 $OUT/gemma3_steps.txt ) &
one expert_streaming every_expert_byte_is_counted_and_the_kernel_counts_the_same_reads
one expert_streaming a_read_failing_in_a_speculative_step_fails_the_request_and_serving_goes_on
one expert_streaming streamed_experts_hold_memory_to_the_cap_and_still_give_mlx_lms_tokens
grep -h "misses,\|MLX peak" $OUT/*.txt
wait
echo "ended at ${SECONDS}s"
