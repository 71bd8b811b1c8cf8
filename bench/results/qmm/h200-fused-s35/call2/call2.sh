#!/usr/bin/env bash
# Session 35 call 2: the three quantized-matmul tests call 1's 330 s limit cut short
# (their float16 8-bit cases), one process each; meanwhile the Qwen3-30B-A3B shape's
# decode step with the fused forms off and on, in turn, in one process (3 of the 16
# cores compile the tests' kernels meanwhile: both configurations share that load).
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O"
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
date +%T
tests="dense_matches_mlx gated_dense_matches_separate_products residual_form_matches_product_then_add"
pids=()
for t in $tests; do
  timeout 520 "$B/quant_kernel" --exact "$t" --nocapture > "/tmp/qk-$t.txt" 2>&1 &
  pids+=($!)
done
timeout 120 python3 bench/make_moe_model.py qwen3-30b-a3b /tmp/a3b > /tmp/a3b-build.txt 2>&1 || tail -n 5 /tmp/a3b-build.txt
date +%T
timeout 300 "$B/decode_step" /tmp/a3b --rows 1 --prompt 128 --steps 64 --passes 4 --fused off,on > "$O/a3b-decode-step.txt" 2>&1
echo "a3b decode_step rc $?"
date +%T
wait "${pids[@]}"
date +%T
for t in $tests; do echo "=== $t"; cat "/tmp/qk-$t.txt"; done > "$O/quant-kernel-tests.txt"
# Summaries last: only the console's tail comes back.
grep -E "^\|   \| 1 row|quantized matmul kernel" "$O/a3b-decode-step.txt"; grep -E "^\| 1 " "$O/a3b-decode-step.txt" | cut -c1-200
for t in $tests; do
  echo "-- $t: $(grep -c 'agrees' /tmp/qk-$t.txt) agree; $(grep -E 'products|equal' /tmp/qk-$t.txt | tail -n 1)"
  grep -E "panicked|differs|test result" "/tmp/qk-$t.txt" | head -n 4
  grep "Float16 8-bit" "/tmp/qk-$t.txt" | tail -n 2
done
