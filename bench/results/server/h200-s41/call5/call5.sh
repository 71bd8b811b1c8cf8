#!/usr/bin/env bash
# Session 41 call 5 (short): G7 at 75% with a prefill chunk attending through MLX's fused
# attention (cuDNN; MLX_SERVE_UNFUSED_PREFILL_KEYS=0: no scores array) instead of composed ops.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name --format=csv,noheader; cat .device/commit; } | tee "$O/machine.txt"
timeout 60 python3 bench/make_moe_model.py qwen3-30b-a3b /root/m-spread --embed-scale 100 > /dev/null 2>&1; sync; echo "a3b model at ${SECONDS}s"
MLX_SERVE_UNFUSED_PREFILL_KEYS=0 timeout $(( 200 - SECONDS )) python3 bench/expert_bench.py --model /root/m-spread --bin $B/mlx-serve --prompt-kind random --temp 0 \
    --no-probe --runs 75% --prompt-tokens 2048 --gen-tokens 16 --out "$O/g7-fused.json" > "$O/g7-fused.txt" 2>&1; echo "g7 rc $? at ${SECONDS}s"
echo "===== SUMMARY at ${SECONDS}s"
grep -E '"run"' $O/g7-fused.txt | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r['run'], 'fused attention: peak_gb', round(r['peak_gb'],3), 'prompt_tps', round(r['prompt_tps'],1), 'decode_tps', round(r['decode_tps'],1), 'hit', r.get('hit'), 'ids', r['ids'][:16])" 2>&1
tail -2 $O/g7-fused.txt | cut -c1-200
