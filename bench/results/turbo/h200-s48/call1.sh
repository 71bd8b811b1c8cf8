#!/usr/bin/env bash
# Session 48 call 1 (binary 2ae480d): on a fresh H200, the compressed warm-up step (0338878) on
# CUDA: two `--turbo-kv balanced` server starts on the Llama-3.1-8B shape (4-bit, random
# weights), the first compiling everything, each with its first request's time to first token
# (before 0338878 the first request of a start compiled 9 TurboQuant instances: 33.1 s); then
# the library's `kv::` tests on CUDA with the kernel cache folder warm; the Qwen3-30B-A3B-shaped
# model is built meanwhile for the next call.
set -u
source .device/prelude.sh
O=$OUT; mkdir -p ~/.cache/huggingface/hub
export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
timeout 120 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
(timeout 200 python3 bench/make_moe_model.py qwen3-30b-a3b /root/m-spread --embed-scale 100 > /dev/null 2>&1; echo "a3b model rc $? at ${SECONDS}s") &
timeout 330 python3 bench/start_probe.py --model /root/llama --mlx-serve $B/mlx-serve --flags "--turbo-kv balanced" --starts 2 --ptx-dir /root/ptx 2>&1 | tee "$O/start-probe-llama-balanced.txt"
echo "balanced probe ended at ${SECONDS}s"
for f in /tmp/start-probe-*/mlx-serve-*.log; do echo "== $f"; grep -E "warmed up|warm-up|CUDA kernels|ERROR|WARN" "$f" | cut -c1-300 | head -6; done
wait
t0=$SECONDS
timeout $((585 - SECONDS)) $B/mlx_serve_lib kv:: --test-threads 2 > "$O/kv-lib-tests.txt" 2>&1; rc=$?
echo "kv:: lib tests: rc $rc in $((SECONDS - t0)) s; $(grep -E '^test result' "$O/kv-lib-tests.txt")"
grep -E "FAILED|panicked|failures:" "$O/kv-lib-tests.txt" | head -8
echo "cache files: $(ls /root/ptx | wc -l); ended at ${SECONDS}s"
