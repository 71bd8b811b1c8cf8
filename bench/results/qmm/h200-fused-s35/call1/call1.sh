#!/usr/bin/env bash
# Session 35 call 1: the quantized-matmul kernel's fused forms (gated: gate, up and
# swiglu in one launch; residual: h + product in one launch) on CUDA — every test of
# server/tests/quant_kernel.rs, one process each — then the Qwen3-30B-A3B and
# Llama-3.1-8B shapes' decode steps with the fused forms off and on, in turn, in one
# process each.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O"
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
date +%T
# The model in a child process (MLX's buffer cache would keep its memory).
(timeout 240 python3 bench/make_moe_model.py qwen3-30b-a3b /tmp/a3b > /tmp/a3b-build.txt 2>&1; date +%T > /tmp/a3b.done) &
build=$!
(timeout 400 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1; date +%T > /tmp/llama.done) &
build_llama=$!
tests=$("$B/quant_kernel" --list 2>&1 | sed -n 's/: test$//p')
pids=()
for t in $tests; do
  timeout 330 "$B/quant_kernel" --exact "$t" --nocapture > "/tmp/qk-$t.txt" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
date +%T
for t in $tests; do echo "=== $t"; cat "/tmp/qk-$t.txt"; done > "$O/quant-kernel-tests.txt"
wait $build
date +%T
timeout 110 "$B/decode_step" /tmp/a3b --rows 1,8 --prompt 128 --steps 64 --passes 3 --fused off,on > "$O/a3b-decode-step.txt" 2>&1
echo "a3b decode_step rc $?"
date +%T
wait $build_llama
date +%T
timeout 110 "$B/decode_step" /tmp/llama --rows 1,8 --prompt 128 --steps 64 --passes 3 --fused off,on > "$O/llama-decode-step.txt" 2>&1
echo "llama decode_step rc $?"
date +%T
echo "a3b built $(cat /tmp/a3b.done 2>/dev/null), llama built $(cat /tmp/llama.done 2>/dev/null)"
tail -3 /tmp/a3b-build.txt /tmp/llama-build.txt
# Summaries last: only the console's tail comes back.
for m in a3b llama; do echo "== $m"; grep -E "^\|   \||quantized matmul kernel" "$O/$m-decode-step.txt"; grep -E "^\| [18] " "$O/$m-decode-step.txt" | cut -c1-200; done
for t in $tests; do
  echo "-- $t: $(grep -c 'agrees' /tmp/qk-$t.txt) agree; $(grep -E 'products|equal' /tmp/qk-$t.txt | tail -1)"
  grep -E "panicked|differs|test result" "/tmp/qk-$t.txt" | head -4
done
