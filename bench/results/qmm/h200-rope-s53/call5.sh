#!/usr/bin/env bash
# Session 53 call 5 (binary 9fd25fe, the machine of call 4 kept warm): the parity stage (`bash bench/quant_kernel_gpu.sh parity`) with one
# rope call for queries and keys (d0a253a) and every kernel on: the ten tests whose mlx-lm
# reference compares on CUDA (llama/qwen2/phi3 bf16 and llama through the batching server take
# the joint rope; qwen3 and the float32 MoE fixtures as before).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx OUT=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
timeout 560 bash bench/quant_kernel_gpu.sh parity 2>&1 | grep -E "ok |FAILED|panicked|left|right" | tee $OUT/parity.txt
cd $OUT && tar -czf parity-logs.tgz parity-*.txt 2>/dev/null && rm -f parity-*.txt
echo "ended at ${SECONDS}s"
