#!/usr/bin/env bash
# Session 47 call 1 (binary 6d891cd): compile-once on an H200. The quantized-matmul tests
# twice in a row with one kernel cache folder (the first process compiles and writes our
# kernels, the second should load them: its time and the folder's contents say so; both check
# the gated and residual forms exactly against MLX's ops), then bench/start_probe.py: two
# server starts on the Llama-3.1-8B shape (4-bit, random weights).
set -u
source .device/prelude.sh
O=$OUT; mkdir -p ~/.cache/huggingface/hub
export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
(timeout 120 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model done") &
for run in 1 2; do
  t0=$SECONDS
  timeout 330 $B/quant_kernel > "$O/quant-kernel-run$run.txt" 2>&1; rc=$?
  echo "quant_kernel run $run: rc $rc in $((SECONDS - t0)) s; $(grep -E '^test result' "$O/quant-kernel-run$run.txt")"
  grep -E "FAILED|panicked" "$O/quant-kernel-run$run.txt" | head -5
  echo "cache: $(ls /root/ptx | grep -c '^custom_kernel.*\.ptx$') custom-kernel modules, $(ls /root/ptx | grep -c '\.ptx$') in all"
done
wait
t0=$SECONDS
timeout $((590 - SECONDS)) python3 bench/start_probe.py --model /root/llama --mlx-serve $B/mlx-serve --starts 2 --ptx-dir /root/ptx 2>&1 | tee "$O/start-probe-llama.txt"
echo "start probe: ${SECONDS}s total"
for f in /tmp/start-probe-*/mlx-serve-*.log; do echo "== $f"; grep -E "warmed up|CUDA kernels|kernel cache|error|WARN" "$f" | cut -c1-400 | head -6; done
