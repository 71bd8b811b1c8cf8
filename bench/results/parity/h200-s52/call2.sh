#!/usr/bin/env bash
# Session 52 call 2 (binary d9592f2): gemma3 bf16 (left mlx-lm's tokens at token 26 in call 1,
# every kernel on, the fused prefill) again with every kernel of ours off, beside the parity
# stage of bench/quant_kernel_gpu.sh run as a stage for the first time (the ten comparable
# tests with every kernel on; failures again with every kernel off).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve MODELS=/root/models OUT=$OUT
mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
t=gemma3_bf16_with_sliding_window_shorter_than_the_prompt_matches_mlx_lm
( MLX_SERVE_DENSE_KERNEL=0 MLX_SERVE_QMM_KERNEL=0 MLX_SERVE_QMM_FUSED=0 MLX_SERVE_STACK_PROJECTIONS=0 \
  MLX_SERVE_GDN_KERNEL=0 MLX_SERVE_TURBO_KERNELS=0 MLX_SERVE_AFFINE_KERNEL=0 MLX_SERVE_ROUTER_KERNEL=0 \
  MLX_SERVE_PROMPT_MATMUL=0 timeout 300 $B/parity --exact $t --test-threads 1 > $OUT/off-$t.txt 2>&1
  grep -q "test result: ok. 1 passed" $OUT/off-$t.txt && echo "off ok     $t" || { echo "off FAILED $t"; grep -E "panicked|left:|right:" $OUT/off-$t.txt | head -4; } ) &
timeout 540 bash bench/quant_kernel_gpu.sh parity 2>&1 | tee "$OUT/parity-stage.txt"
wait
echo "ended at ${SECONDS}s"
