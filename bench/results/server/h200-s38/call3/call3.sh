#!/usr/bin/env bash
# Session 38 call 3: prompt products dequantized then multiplied (c359b09) on the H200: the
# kernel tests for it, then the server alone, 1 and 8 streams + the prompt-cache section,
# Llama-3.1-8B shape 4-bit: on, off (MLX_SERVE_PROMPT_MATMUL=0), on.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
timeout 150 $B/quant_kernel prompt_ > "$O/tests.txt" 2>&1; echo "tests rc $? $(date +%T)"
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
date +%T
sb() { # name [env...]
  local name=$1; shift
  env "$@" timeout 170 python3 bench/server_bench.py --model /tmp/llama --mlx-serve $B/mlx-serve --python python3 --no-ref \
    --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --label "$name" \
    --out "$O/$name.json" > "$O/$name.txt" 2>&1
  echo "$name rc $? $(date +%T)"
}
sb on1
sb off1 MLX_SERVE_PROMPT_MATMUL=0
left=$(( 560 - SECONDS )); echo "left $left"
[ $left -gt 80 ] && sb on2
grep -E "^test |test result" "$O/tests.txt"
for n in on1 off1 on2; do
  [ -f "$O/$n.txt" ] || continue
  echo "== $n"; grep -E "^\| (1|8) \|" "$O/$n.txt"; grep -E "^\| (TTFT \(ms\)|aggregate tok/s|TTFT cold \(ms\)|TTFT after shared prefix \(ms\)) " "$O/$n.txt"
done
