#!/usr/bin/env bash
# Session 49 call 1 (binary cd53907), a fresh H200: issue 15's whole quant_kernel test file on
# CUDA, each test split over 4 processes (`MLX_SERVE_TEST_SHARD`, bbeffab), every kernel instance
# compiled by NVRTC here (the kernel cache folder starts empty); then the Qwen3-30B-A3B-shaped
# model is built for a later call.
set -u
source .device/prelude.sh
O=$OUT; mkdir -p ~/.cache/huggingface/hub
export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
t0=$SECONDS
SHARDS=4 BIN_DIR=.device/bin OUT=$O/qk timeout 520 bash bench/quant_kernel_gpu.sh tests 2>&1 | tee "$O/quant-kernel-tests.txt"
echo "tests: rc ${PIPESTATUS[0]} in $((SECONDS - t0)) s; cache files: $(ls /root/ptx | wc -l)"
(cd $O/qk && for f in quant-kernel-*-0.txt; do echo "$f: $(grep -E '^test result' $f)"; done) | head -20
tar -C $O -czf $O/qk-logs.tgz qk && rm -rf $O/qk
[ $SECONDS -lt 540 ] && timeout $((590 - SECONDS)) python3 bench/make_moe_model.py qwen3-30b-a3b /root/m-spread --embed-scale 100 > /dev/null 2>&1; echo "a3b model rc $? at ${SECONDS}s"
