#!/usr/bin/env bash
# Session 41 call 4: the pacing test with model-sized products on CUDA (three runs); Llama-3.1-8B
# 4-bit beside mlx-lm with every prompt temporary paced (attention's scores too: no regression
# against session 40's 12366 / 15125 tok/s?); G7 at 75% with the paced attention.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
export MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve
for i in 1 2 3; do
  timeout 60 $B/prompt_matmul --test-threads 1 --nocapture > /tmp/pm$i.txt 2>&1; echo "run $i rc=$? at ${SECONDS}s" >> $O/prompt_matmul.txt
  grep -E "peak above|test result|panicked" /tmp/pm$i.txt >> $O/prompt_matmul.txt
done
timeout 100 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -3 /tmp/llama-build.txt
echo "llama at ${SECONDS}s"
gb() { # prefill limit
  timeout $2 python3 bench/generate_bench.py --model /tmp/llama --mlx-serve $B/mlx-serve --prompt-tokens 4096 \
    --gen-tokens 16 --prefill-size $1 --runs 1 --out "$O/llama-c$1.json" > "$O/llama-c$1.txt" 2>&1
  echo "llama c$1 rc $? at ${SECONDS}s"
}
gb 512 150
timeout 80 python3 bench/make_moe_model.py qwen3-30b-a3b /root/m-spread --embed-scale 100 > /dev/null 2>&1; sync; echo "a3b model at ${SECONDS}s"
left=$(( 540 - SECONDS ))
[ $left -gt 70 ] && { timeout $(( left - 5 )) python3 bench/expert_bench.py --model /root/m-spread --bin $B/mlx-serve --prompt-kind random --temp 0 \
    --no-probe --runs 75% --prompt-tokens 2048 --gen-tokens 16 --out "$O/g7.json" > "$O/g7.txt" 2>&1; echo "g7 rc $? at ${SECONDS}s"; }
left=$(( 560 - SECONDS )); [ $left -gt 90 ] && gb 2048 $(( left - 5 ))
echo "===== SUMMARY at ${SECONDS}s"
cat $O/prompt_matmul.txt
for f in "$O"/llama-c*.txt; do echo "== $(basename $f)"; grep -E "^model|^\| (prompt|gen|peak)|^greedy" "$f"; grep -E "Error|error" "$f" | tail -2 | cut -c1-200; done
grep -E '"run"' $O/g7.txt | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r['run'], 'peak_gb', round(r['peak_gb'],3), 'prompt_tps', round(r['prompt_tps'],1), 'decode_tps', round(r['decode_tps'],1), 'hit', r.get('hit'))" 2>&1
