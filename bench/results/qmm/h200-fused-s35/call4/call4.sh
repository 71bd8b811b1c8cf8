#!/usr/bin/env bash
# Session 35 call 4: the quantized-matmul kernel's normed forms (the RMS norm before a
# product taken by the product's kernel) on CUDA — their two tests, one process each —
# and meanwhile the Llama-3.1-8B shape's decode step with every fused form off and on,
# in turn, in one process (the tests' compiles share the host: both configurations alike).
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O"
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
date +%T
limit=${CALL_LIMIT:-280}
tests="normed_forms_match_rms_norm_then_product unsupported_normed_calls_fall_back decode_batches_take_the_kernel"
pids=()
for t in $tests; do
  timeout $(( limit - 15 )) "$B/quant_kernel" --exact "$t" --nocapture > "/tmp/qk-$t.txt" 2>&1 &
  pids+=($!)
done
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -n 5 /tmp/llama-build.txt
date +%T
left=$(( limit - 10 - SECONDS ))
[ $left -gt 30 ] && timeout $left "$B/decode_step" /tmp/llama --rows 1 --prompt 128 --steps 64 --passes 3 --fused off,on > "$O/llama-decode-step.txt" 2>&1
echo "llama decode_step rc $?"
date +%T
wait "${pids[@]}"
date +%T
for t in $tests; do echo "=== $t"; cat "/tmp/qk-$t.txt"; done > "$O/quant-kernel-tests.txt"
# Summaries last: only the console's tail comes back.
grep -E "^\|   \| 1 row|quantized matmul kernel" "$O/llama-decode-step.txt"; grep -E "^\| 1 " "$O/llama-decode-step.txt" | cut -c1-200
for t in $tests; do
  echo "-- $t: $(grep -c 'agrees' /tmp/qk-$t.txt) agree"
  grep -E "panicked|differs|test result" "/tmp/qk-$t.txt" | head -n 4
  grep -E "agrees" "/tmp/qk-$t.txt" | tail -n 2
done
