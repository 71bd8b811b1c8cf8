#!/usr/bin/env bash
# Session 37 call 3: the server before (aabefc9: one burst reached the engine as 1 + 4 + 3
# prompts, sequences joining one at a time) and after (7906447: the idle engine waits for the
# requests on their way, a burst's shared calls take the burst turn's tokens, joins in one copy),
# 1 and 8 streams, Llama-3.1-8B shape 4-bit; the "after" binary also beside mlx_lm.server.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
xz -dc .device/mlx-serve-aabefc9.xz > $B/mlx-serve-before; chmod +x $B/mlx-serve-before
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
date +%T
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
date +%T
sb() { # name binary extra...
  local name=$1 bin=$2; shift 2
  timeout 230 python3 bench/server_bench.py --model /tmp/llama --mlx-serve "$bin" --python python3 "$@" \
    --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --label "$name" \
    --out "$O/$name.json" > "$O/$name.txt" 2>&1
  echo "$name rc $? $(date +%T)"
}
sb before1 $B/mlx-serve-before --no-ref
sb after1 $B/mlx-serve
left=$(( 540 - SECONDS )); echo "left $left"
[ $left -gt 80 ] && sb before2 $B/mlx-serve-before --no-ref
left=$(( 540 - SECONDS )); echo "left $left"
[ $left -gt 80 ] && sb after2 $B/mlx-serve --no-ref
for n in before1 after1 before2 after2; do
  [ -f "$O/$n.txt" ] || continue
  echo "== $n"; grep -E "^\| (1|8) \|" "$O/$n.txt"; grep -E "^\| (TTFT \(ms\)|aggregate tok/s|decode tok/s per stream) " "$O/$n.txt"
done
