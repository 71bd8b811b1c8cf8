#!/usr/bin/env bash
# Session 41 call 3: MoE prompt products dequantized and every prompt temporary paced (MoE rows,
# dequantized stacks, unfused attention's scores): the Qwen3-30B-A3B shape (4-bit, random weights)
# beside mlx-lm, 4K prompt, 2048- and 512-token chunks, greedy tokens compared; then G7's 100% run
# and the resident run (expert_bench, as bench/expert_gpu.sh budgets runs them).
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
export MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve
timeout 60 $B/prompt_matmul --test-threads 1 > $O/prompt_matmul.txt 2>&1; echo "rc=$? at ${SECONDS}s" >> $O/prompt_matmul.txt
timeout 80 python3 bench/make_moe_model.py qwen3-30b-a3b /root/m-spread --embed-scale 100 > /dev/null 2>&1; sync; echo "a3b model at ${SECONDS}s"
gb() { # prompt prefill limit
  timeout $3 python3 bench/generate_bench.py --model /root/m-spread --mlx-serve $B/mlx-serve --prompt-tokens $1 \
    --gen-tokens 16 --prefill-size $2 --runs 1 --out "$O/p$1-c$2.json" > "$O/p$1-c$2.txt" 2>&1
  echo "p$1 c$2 rc $? at ${SECONDS}s"
}
gb 4096 2048 200
gb 4096 512 150
left=$(( 565 - SECONDS )); echo "left $left"
if [ $left -gt 60 ]; then
  timeout $(( left - 5 )) python3 bench/expert_bench.py --model /root/m-spread --bin $B/mlx-serve --prompt-kind random --temp 0 \
    --no-probe --runs 100%,resident --prompt-tokens 2048 --gen-tokens 16 --out "$O/g7.json" > "$O/g7.txt" 2>&1
  echo "g7 rc $? at ${SECONDS}s"
fi
echo "===== SUMMARY at ${SECONDS}s"
grep -E "test result|rc=|panicked" $O/prompt_matmul.txt | head -4
for f in "$O"/p*.txt; do echo "== $(basename $f)"; grep -E "^model|^\| (prompt|gen|peak)|^greedy" "$f"; grep -E "Error|error" "$f" | tail -2 | cut -c1-200; done
grep -E '"run"' $O/g7.txt | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r['run'], 'peak_gb', round(r['peak_gb'],3), 'prompt_tps', round(r['prompt_tps'],1), 'decode_tps', round(r['decode_tps'],1))" 2>&1
tail -2 $O/g7.txt | cut -c1-200
