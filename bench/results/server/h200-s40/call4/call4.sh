#!/usr/bin/env bash
# Session 40 call 4 (EXPERIMENT): weights copied into device memory at load (MLX_SERVE_DEVICE_WEIGHTS=1)
# against weights left where the file reader put them (CUDA managed memory): resident
# Qwen3-30B-A3B shape (expert_bench, 2K prompt, 64 generated) and Llama-3.1-8B 4-bit (generate).
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name --format=csv,noheader; cat .device/commit; } | tee "$O/machine.txt"
timeout 60 python3 bench/make_moe_model.py qwen3-30b-a3b /root/m-spread --embed-scale 100 > /dev/null 2>&1; sync; echo "a3b model at ${SECONDS}s"
eb() { # label limit env
  env $3 timeout $2 python3 bench/expert_bench.py --model /root/m-spread --bin $B/mlx-serve --prompt-kind random --temp 0 --no-probe \
    --prompt-tokens 2048 --gen-tokens 64 --runs resident 2>&1 | grep -E '"run"' | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print('a3b $1', 'peak_gb', round(r['peak_gb'],3), 'prompt_tps', round(r['prompt_tps'],1), 'decode_tps', round(r['decode_tps'],1), 'wall', round(r['wall_s'],1))"; }
eb warm-off 150 X=0 | tee -a "$O/a3b.txt"
eb on1 80 MLX_SERVE_DEVICE_WEIGHTS=1 | tee -a "$O/a3b.txt"
eb off1 80 X=0 | tee -a "$O/a3b.txt"
eb on2 80 MLX_SERVE_DEVICE_WEIGHTS=1 | tee -a "$O/a3b.txt"
echo "a3b done at ${SECONDS}s"
left=$(( 530 - SECONDS )); [ $left -lt 90 ] && { echo "no time for llama"; echo "===== SUMMARY"; cat "$O/a3b.txt"; exit 0; }
timeout 60 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
P=$(python3 -c "print(' '.join(['the model token server memory cache layer weight attention']*57))")
lg() { env $2 timeout 45 $B/mlx-serve generate --model /tmp/llama --prompt "$P" --max-tokens 128 --ignore-chat-template --ignore-eos --warmup --json 2>/dev/null | python3 -c "
import json,sys; r=json.load(sys.stdin); print('llama $1', r['prompt_tokens'], 'prompt_tps', round(r['prompt_tps'],1), 'gen_tps', round(r['generation_tps'],1), 'peak_gb', round(r['peak_memory_bytes']/1e9,3))"; }
for round in 1 2; do
  [ $(( 540 - SECONDS )) -lt 50 ] && break; lg off$round X=0 | tee -a "$O/llama.txt"
  [ $(( 540 - SECONDS )) -lt 50 ] && break; lg on$round MLX_SERVE_DEVICE_WEIGHTS=1 | tee -a "$O/llama.txt"
done
echo "===== SUMMARY at ${SECONDS}s"
cat "$O/a3b.txt" "$O/llama.txt" 2>/dev/null
