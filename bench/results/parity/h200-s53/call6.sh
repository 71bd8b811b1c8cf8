#!/usr/bin/env bash
# Session 53 call 6 (binary 10f9897, a fresh machine): the speculative-read failure
# test answering each prompt twice before the damaged request. The 4-bit fixture is the one built
# on the CPU here, carried in .device/fixture (the test reads only its weights and prompt; mlx-lm
# builds it in ~200 s on CUDA).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve
mkdir -p ~/.cache/huggingface/hub target/tmp/parity
cp -r .device/fixture/* target/tmp/parity/
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
T=a_read_failing_in_a_speculative_step_fails_the_request_and_serving_goes_on
timeout 380 $B/expert_streaming --exact $T --test-threads 1 --nocapture > $OUT/$T.txt 2>&1
grep -E "prompt [0-9]|test result|panicked" -A1 $OUT/$T.txt | head -20
echo "ended at ${SECONDS}s"
