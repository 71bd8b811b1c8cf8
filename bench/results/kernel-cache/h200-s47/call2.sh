#!/usr/bin/env bash
# Session 47 call 2 (binary 6d891cd): the gated and residual forms' exact checks against MLX's
# ops (their swiglu and add now written in the kernel), then bench/start_probe.py: two server
# starts on the Llama-3.1-8B shape (4-bit, random weights) with one kernel cache folder.
# (Call 1 ran the whole quant_kernel test twice: neither run ended inside 330 s.)
set -u
source .device/prelude.sh
O=$OUT; mkdir -p ~/.cache/huggingface/hub
export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; ls /root/ptx 2>/dev/null | wc -l
(timeout 120 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model done at ${SECONDS}s") &
t0=$SECONDS
timeout 250 $B/quant_kernel gated_dense_matches_separate_products residual_form_matches_product_then_add --test-threads 2 > "$O/quant-kernel-exact.txt" 2>&1; rc=$?
echo "exact tests: rc $rc in $((SECONDS - t0)) s; $(grep -E '^test result' "$O/quant-kernel-exact.txt")"
grep -E "^test |FAILED|panicked|equal" "$O/quant-kernel-exact.txt" | head -12
echo "cache: $(ls /root/ptx | grep -c '^custom_kernel.*\.ptx$') custom-kernel modules, $(ls /root/ptx | grep -c '\.ptx$') in all"
wait
timeout $((595 - SECONDS)) python3 bench/start_probe.py --model /root/llama --mlx-serve $B/mlx-serve --starts 2 --ptx-dir /root/ptx 2>&1 | tee "$O/start-probe-llama.txt"
echo "start probe ended at ${SECONDS}s"
for f in /tmp/start-probe-*/mlx-serve-*.log; do echo "== $f"; grep -E "warmed up|CUDA kernels|kernel cache|start-up check|ERROR|WARN" "$f" | cut -c1-300 | head -8; done
