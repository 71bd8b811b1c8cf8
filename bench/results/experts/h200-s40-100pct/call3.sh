#!/usr/bin/env bash
# Session 40 call 3: (1) bench/pacer_probe.py on CUDA: what a paced chain of prompt products keeps;
# (2) the A3B shape at 100% against resident, prefill only (1 token) and with speculation off:
# where the 100% run's peak above resident comes from.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name --format=csv,noheader; cat .device/commit; } | tee "$O/machine.txt"
timeout 150 python3 bench/pacer_probe.py --sizes 512x256,2048x256,2048x1024,4096x512 > "$O/pacer.txt" 2>&1; echo "pacer rc $? at ${SECONDS}s"
timeout 60 python3 bench/make_moe_model.py qwen3-30b-a3b /root/m-spread --embed-scale 100 > /dev/null 2>&1; sync; echo "model at ${SECONDS}s"
eb() { timeout $1 python3 bench/expert_bench.py --model /root/m-spread --bin $B/mlx-serve --prompt-kind random --temp 0 --no-probe \
  --prompt-tokens 2048 "${@:2}" 2>&1 | grep -E '"run"' | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r['run'], 'gen', r.get('generated_tokens', '?'), 'peak_gb', round(r['peak_gb'],3), 'prompt_tps', round(r['prompt_tps'],1), 'decode_tps', round(r.get('decode_tps',0),1), 'spec', r.get('speculative_steps'))"; }
eb 200 --runs resident,100% --gen-tokens 1 > "$O/g1.txt"; echo "g1 at ${SECONDS}s"
left=$(( 540 - SECONDS )); [ $left -gt 60 ] && eb $left --runs 100%-nospec --gen-tokens 64 > "$O/nospec.txt"; echo "nospec at ${SECONDS}s"
echo "===== SUMMARY"
cat "$O/pacer.txt" | tail -8; cat "$O/g1.txt" "$O/nospec.txt" 2>/dev/null
