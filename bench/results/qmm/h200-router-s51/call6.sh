#!/usr/bin/env bash
# Session 51 call 6 (binary with the composed prefill attention's float32 scores, 4096 keys), a
# fresh H200: the parity suite's 16-bit tests that differed from mlx-lm on CUDA with the composed
# attention's bf16 scores (calls 3-4) and gave mlx-lm's tokens through MLX's fused kernel
# (call 5), now with the defaults; gemma3 bf16 too (it differed from token 26 since 2026-11-28).
# Then the server stage (bench/quant_kernel_gpu.sh server): with the defaults if every test
# passed, else with MLX_SERVE_UNFUSED_PREFILL_KEYS=0 (prefill through MLX's fused kernel) to
# measure what that costs the time to first token.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve MODELS=/root/models OUT=$OUT
mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
tests="llama_bf16_greedy_matches_mlx_lm qwen3_bf16_greedy_matches_mlx_lm qwen2_bf16_greedy_matches_mlx_lm
phi3_bf16_with_longrope_matches_mlx_lm gemma3_bf16_with_sliding_window_shorter_than_the_prompt_matches_mlx_lm
llama_bf16_through_the_batching_server_matches_mlx_lm"
printf '%s\n' $tests | xargs -P 3 -I{} sh -c "timeout 200 $B/parity --exact {} --test-threads 1 > $OUT/{}.txt 2>&1"
failed=0
for t in $tests; do
  if grep -q "test result: ok. 1 passed" "$OUT/$t.txt"; then echo "ok     $t"
  else echo "FAILED $t"; failed=1; grep -E "panicked|left:|right:" "$OUT/$t.txt" | head -4; fi
done
echo "parity ended at ${SECONDS}s"
[ $failed = 1 ] && export MLX_SERVE_UNFUSED_PREFILL_KEYS=0
echo "server stage with MLX_SERVE_UNFUSED_PREFILL_KEYS=${MLX_SERVE_UNFUSED_PREFILL_KEYS:-default}"
timeout $((590 - SECONDS)) bash bench/quant_kernel_gpu.sh server 2>&1 | tee "$OUT/server.txt" | grep -E "TTFT|aggregate|decode tok/s"
echo "ended at ${SECONDS}s"
