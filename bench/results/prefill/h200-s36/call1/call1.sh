#!/usr/bin/env bash
# Session 36 call 1: (a) where 8 prompts' prefill goes on CUDA — one model call each (the
# engine's order) against one left-padded call (mlx-lm's batching), and what an unseen prompt
# length costs (bench/prefill_probe.py, mlx-lm's model); (b) one stream through the engine
# (`mlx-serve generate`) against decode_step's engine loop on the same binary and machine.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O"
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
date +%T
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -n 5 /tmp/llama-build.txt
date +%T
timeout 240 python3 bench/prefill_probe.py /tmp/llama --rows 1,2,4,8 --lengths 128,512 --reps 5 > "$O/prefill-probe.txt" 2>&1
echo "probe rc $?"; date +%T
P=$(python3 -c "import random; r=random.Random(1); w='model token server memory cache layer weight attention value key query stream'.split(); print(' '.join(r.choice(w) for _ in range(120)))")
for i in 1 2; do
  timeout 60 "$B/mlx-serve" generate --model /tmp/llama --prompt "$P" --max-tokens 256 > "/tmp/gen$i.txt" 2>&1
  echo "generate $i rc $?"
done
date +%T
timeout 120 "$B/decode_step" /tmp/llama --rows 1 --prompt 128 --steps 256 --passes 2 --engine-loop > "$O/decode-step-engine-loop.txt" 2>&1
echo "decode_step rc $?"; date +%T
for i in 1 2; do grep -E "^Prompt:|^Generation:" /tmp/gen$i.txt; done | tee "$O/generate.txt"
grep -E "^\| 1 " "$O/decode-step-engine-loop.txt" | cut -c1-220
cat "$O/prefill-probe.txt" | tail -n 20
