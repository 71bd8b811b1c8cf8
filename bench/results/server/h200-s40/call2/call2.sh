#!/usr/bin/env bash
# Session 40 call 2 (binary 6ac43b8: paced prompt products, the head on MLX's op): a 4K prompt's
# prefill in 512- and 2048-token chunks beside mlx-lm (peak memory and speed), then the server
# with mlx_lm.server beside at 1 and 8 streams. Llama-3.1-8B shape 4-bit, random weights.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
timeout 100 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
echo "model $(date +%T) at ${SECONDS}s"
gb() { # prompt prefill limit [env]
  env $4 timeout $3 python3 bench/generate_bench.py --model /tmp/llama --mlx-serve $B/mlx-serve --prompt-tokens $1 \
    --gen-tokens 16 --prefill-size $2 --runs 1 --out "$O/p$1-c$2$5.json" > "$O/p$1-c$2$5.txt" 2>&1
  echo "p$1 c$2 $4 rc $? at ${SECONDS}s"
}
gb 4096 512 170 MLX_SERVE_X=1 ""
gb 4096 2048 110 MLX_SERVE_X=1 ""
left=$(( 560 - SECONDS )); echo "left $left"
if [ $left -gt 150 ]; then
  timeout $(( left - 10 )) python3 bench/server_bench.py --model /tmp/llama --mlx-serve $B/mlx-serve --python python3 \
    --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --label 6ac43b8 \
    --out "$O/server.json" > "$O/server.txt" 2>&1
  echo "server rc $? at ${SECONDS}s"
fi
echo "===== SUMMARY"
for f in "$O"/p*.txt; do echo "== $(basename $f)"; grep -E "prompt tok/s|TTFT|generation tok/s|peak|^\|" "$f" | head -10; done
[ -f "$O/server.txt" ] && { echo "== server"; grep -E "^\| (1|8) \|" "$O/server.txt"; grep -E "^\| (TTFT \(ms\)|aggregate tok/s|decode tok/s per stream|prefill) " "$O/server.txt"; tail -3 "$O/server.txt"; }
