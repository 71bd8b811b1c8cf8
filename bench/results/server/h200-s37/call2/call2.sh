#!/usr/bin/env bash
# Session 37 call 2: where a decode step's time goes at 1 and 8 rows. decode_step (engine loop,
# rows of other lengths) as MLX launches by default, then with one CUDA graph a step
# (MLX_MAX_OPS_PER_BUFFER=5000: the device starts only when the whole step is launched, so one
# step at a time minus build and launch is the step's device time); then the server alone
# (server_bench --no-ref) with the steps' host split, 1 and 8 streams.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
date +%T
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
date +%T
timeout 150 $B/decode_step /tmp/llama --rows 1,8 --prompt 128 --steps 64 --passes 2 --engine-loop --ragged > "$O/decode-step.txt" 2>&1
echo "decode_step rc $?"; date +%T
MLX_MAX_OPS_PER_BUFFER=5000 timeout 100 $B/decode_step /tmp/llama --rows 1,8 --prompt 128 --steps 64 --passes 2 --engine-loop --ragged > "$O/decode-step-one-graph.txt" 2>&1
echo "decode_step one graph rc $?"; date +%T
timeout 250 python3 bench/server_bench.py --model /tmp/llama --mlx-serve "$B/mlx-serve" --python python3 --no-ref \
  --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --label "$(cat .device/commit)" \
  --out "$O/server-alone.json" > "$O/server-bench.txt" 2>&1
echo "server_bench rc $?"; date +%T
echo "== decode_step"; grep -E "^\| [0-9]" "$O/decode-step.txt"
echo "== decode_step, one graph a step"; grep -E "^\| [0-9]" "$O/decode-step-one-graph.txt"
echo "== server"; grep -A4 "engine thread" "$O/server-bench.txt"; grep -E "aggregate|TTFT \(ms\)|decode tok/s" "$O/server-bench.txt"
