#!/usr/bin/env bash
# Session 52 call 1 (binary d9592f2, `scripts/device-bundle.sh --bench`), a fresh H200: the
# Gated DeltaNet CUDA kernel as rewritten in 6bb7d15 (MLX's row-reduction order, mlx-lm's
# roundings) run for the first time: does Qwen3.5 bf16 keep mlx-lm's tokens on CUDA with it?
# Beside it gemma3 bf16 (alone and through the server) with the fused prefill default. If
# Qwen3.5 fails: again with the state update unfused (a parity binary built from 6bb7d15's
# kernel with `__fadd_rn(s, __fmul_rn(k, delta))` in place of the FMA, packed as
# .device/parity_nofma.xz), and with the kernel off.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve RUST_LOG=info
mkdir -p ~/.cache/huggingface/hub
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
xz -dc .device/parity_nofma.xz > $B/parity_nofma && chmod +x $B/parity_nofma
one() {  # one TAG BIN TEST
  timeout 300 $B/$2 --exact $3 --test-threads 1 --nocapture > $OUT/$1-$3.txt 2>&1
  if grep -q "test result: ok. 1 passed" $OUT/$1-$3.txt; then echo "$1 ok     $3"
  else echo "$1 FAILED $3"; grep -E "panicked|left:|right:|differ" $OUT/$1-$3.txt | head -6; fi
  grep -ho "Gated DeltaNet[^\"]*" $OUT/$1-$3.txt | sort | uniq -c | head -3
}
# gemma3's two tests share a fixture: the server one starts after the other built it.
one on parity qwen3_5_bf16_matches_mlx_lm &
(one on parity gemma3_bf16_with_sliding_window_shorter_than_the_prompt_matches_mlx_lm;
 one on parity gemma3_with_sliding_windows_through_the_server_matches_mlx_lm) &
wait
echo "kernel run ended at ${SECONDS}s"
if ! grep -q "test result: ok. 1 passed" $OUT/on-qwen3_5_bf16_matches_mlx_lm.txt; then
  one nofma parity_nofma qwen3_5_bf16_matches_mlx_lm &
  MLX_SERVE_GDN_KERNEL=0 one gdnoff parity qwen3_5_bf16_matches_mlx_lm &
  wait
fi
echo "ended at ${SECONDS}s"
