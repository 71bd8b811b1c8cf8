#!/usr/bin/env bash
# Session 51 call 4 (call 3's script with MLX's defaults and 4-bit fixtures): the parity suite's float32 and 16-bit
# tests on CUDA with every kernel on (the defaults: the MoE router kernel serves the float32
# MoE fixtures' routing, the 16-bit attention kernel the bf16 ones), MLX_ENABLE_TF32=0 for
# mlx-lm's fixture maker and our engine alike (MLX runs float32 matmuls as TF32 on CUDA
# otherwise, and the batched float32 tests differed there: bench/results/parity/
# h100-cuda-failures-1128.md). Tests that fail run again with every kernel off.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve
mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
# MLX_ENABLE_TF32 left at its default (1) this time; the 16-bit tests again, and 4-bit fixtures.
tests="llama_bf16_greedy_matches_mlx_lm qwen3_bf16_greedy_matches_mlx_lm qwen2_bf16_greedy_matches_mlx_lm
phi3_bf16_with_longrope_matches_mlx_lm qwen3_5_bf16_matches_mlx_lm gemma4_with_kv_sharing_and_per_layer_inputs_matches_mlx_lm
qwen3_moe_4bit_with_a_dense_layer_matches_mlx_lm mixtral_4bit_greedy_matches_mlx_lm olmoe_4bit_greedy_matches_mlx_lm
qwen2_moe_4bit_greedy_matches_mlx_lm gpt_oss_4bit_greedy_matches_mlx_lm llama_bf16_through_the_batching_server_matches_mlx_lm"
run() {  # run TAG TEST...: each test alone, three at a time
  local tag=$1; shift
  printf '%s\n' "$@" | xargs -P 3 -I{} sh -c "timeout 240 $B/parity --exact {} --test-threads 1 > $OUT/$tag-{}.txt 2>&1"
  for t in "$@"; do
    if grep -q "test result: ok. 1 passed" "$OUT/$tag-$t.txt"; then echo "$tag ok     $t"
    else echo "$tag FAILED $t"; grep -E "panicked|left:|right:" "$OUT/$tag-$t.txt" | head -4; fi
  done
}
run on $tests
echo "kernels on ended at ${SECONDS}s"
failed=$(for t in $tests; do grep -q "test result: ok. 1 passed" "$OUT/on-$t.txt" || echo $t; done)
if [ -n "$failed" ] && [ $SECONDS -lt 330 ]; then
  MLX_SERVE_DENSE_KERNEL=0 MLX_SERVE_QMM_KERNEL=0 MLX_SERVE_STACK_PROJECTIONS=0 MLX_SERVE_GDN_KERNEL=0 \
    MLX_SERVE_TURBO_KERNELS=0 MLX_SERVE_ROUTER_KERNEL=0 MLX_SERVE_AFFINE_KERNEL=0 MLX_SERVE_PROMPT_MATMUL=0 \
    MLX_SERVE_QMM_FUSED=0 run off $failed
fi
MLX_SERVE_GDN_KERNEL=0 run gdn-off qwen3_5_bf16_matches_mlx_lm
echo "ended at ${SECONDS}s"
