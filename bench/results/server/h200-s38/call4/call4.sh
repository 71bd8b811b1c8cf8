#!/usr/bin/env bash
# Session 38 call 4: prompt products dequantized then multiplied (c359b09), off and on alternating:
# the server alone, 1 and 8 streams, the prompt-cache section at a ~4000-token prompt,
# Llama-3.1-8B shape 4-bit: off, on, off, on (MLX_SERVE_PROMPT_MATMUL=0 is off).
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
date +%T
sb() { # name [env...]
  local name=$1; shift
  env "$@" timeout ${LIMIT:-120} python3 bench/server_bench.py --model /tmp/llama --mlx-serve $B/mlx-serve --python python3 --no-ref \
    --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --prefix-tokens 4000 --label "$name" \
    --out "$O/$name.json" > "$O/$name.txt" 2>&1
  echo "$name rc $? $(date +%T)"
}
LIMIT=210 sb off1 MLX_SERVE_PROMPT_MATMUL=0
sb on1
sb off2 MLX_SERVE_PROMPT_MATMUL=0
left=$(( 570 - SECONDS )); echo "left $left"
[ $left -gt 80 ] && sb on2
for n in off1 on1 off2 on2; do
  [ -f "$O/$n.txt" ] || continue
  echo "== $n"; grep -E "^\| (1|8) \|" "$O/$n.txt"; grep -E "^\| (TTFT \(ms\)|aggregate tok/s|TTFT cold \(ms\)|TTFT after shared prefix \(ms\)) " "$O/$n.txt"
done
