#!/usr/bin/env bash
# Session 52 call 3 (binary b651be4, `scripts/device-bundle.sh --bench`, which now packs the
# expert_streaming tests): streamed experts on CUDA against mlx-lm's own CUDA tokens. The
# float32 fixture (Qwen3-MoE, 64 experts top-4) at 25/10/50/100% budgets with read-ahead,
# speculation and guesses, and without them (MLX_ENABLE_TF32=0 for mlx-lm's fixture maker and
# our engine alike: MLX runs float32 matmuls as TF32 on CUDA otherwise), and the float32
# memory test (mlx-lm's greedy text through the server at 10% and 50%, MLX's peak bounded);
# beside them the server tests whose counters are checked against /proc/self/io and the
# error tests. Left out: the 4-bit parity tests (mlx-lm's 4-bit fixtures are degenerate on
# CUDA, session 51).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve MLX_ENABLE_TF32=0
mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
# O_DIRECT needs a filesystem that takes it: the fixtures live under the repository's target/.
df -hT . | tail -1
one() {  # one TEST: alone, its output in $OUT/TEST.txt
  timeout 540 $B/expert_streaming --exact $1 --test-threads 1 --nocapture > $OUT/$1.txt 2>&1
  if grep -q "test result: ok. 1 passed" $OUT/$1.txt; then echo "ok     $1 (${SECONDS}s)"
  else echo "FAILED $1 (${SECONDS}s)"; grep -E -A2 "panicked" $OUT/$1.txt | head -6; fi
}
one streamed_qwen3_moe_fp32_matches_mlx_lm_at_every_budget &
one streamed_experts_hold_memory_to_the_cap_and_still_give_mlx_lms_tokens &
( for t in every_expert_byte_is_counted_and_the_kernel_counts_the_same_reads a_streamed_model_prefills_in_2048_token_chunks_unless_told \
    decode_steps_read_the_next_layers_guessed_experts_and_count_them speculative_decode_steps_give_the_same_text_with_fewer_read_backs_and_count_every_read \
    a_cache_holding_every_expert_reads_them_once_at_load_and_never_syncs a_corrupt_or_truncated_shard_fails_the_request_naming_file_and_tensor_and_serving_goes_on \
    a_read_failing_in_a_speculative_step_fails_the_request_and_serving_goes_on budgets_below_one_tokens_experts_and_models_without_experts_are_refused_at_start_up; do
    one $t; done ) &
wait
grep -h "streamed at\|MLX peak\|misses,\|tokens identical" $OUT/*.txt | head -40
echo "ended at ${SECONDS}s"
