#!/bin/bash
# Session 41 call 1: prompt_matmul tests on CUDA (drained pacing test), weight placement probe,
# MoE prompt-product probe, and a resident A3B prefill peak with weights present (--warmup).
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name --format=csv,noheader; cat .device/commit; } | tee "$O/machine.txt"
export MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve
timeout 120 $B/prompt_matmul --test-threads 1 > $O/prompt_matmul.txt 2>&1; echo "rc=$? at ${SECONDS}s" >> $O/prompt_matmul.txt
(cd bench && timeout 100 python3 weight_memory_probe.py) > $O/weight_memory.txt 2>&1; echo "rc=$? at ${SECONDS}s" >> $O/weight_memory.txt
(cd bench && timeout 120 python3 moe_prefill_probe.py) > $O/moe_prefill.txt 2>&1; echo "rc=$? at ${SECONDS}s" >> $O/moe_prefill.txt
left=$(( 560 - SECONDS ))
if [ $left -gt 150 ]; then
  timeout 70 python3 bench/make_moe_model.py qwen3-30b-a3b /root/m-spread --embed-scale 100 > /dev/null 2>&1; sync; echo "a3b model at ${SECONDS}s" >> $O/a3b.txt
  P=$(python3 -c "print(' '.join(['the model token server memory cache layer weight attention']*200))")
  timeout $(( 560 - SECONDS )) $B/mlx-serve generate --model /root/m-spread --prompt "$P" --max-tokens 4 --ignore-chat-template --ignore-eos --warmup \
    --prefill-size 1024 --json 2>>$O/a3b.err | python3 -c "
import json,sys; r=json.load(sys.stdin); print('a3b resident warm', r['prompt_tokens'], 'prefill 1024 prompt_tps', round(r['prompt_tps'],1), 'peak_gb', round(r['peak_memory_bytes']/1e9,3))" >> $O/a3b.txt 2>&1
  echo "a3b rc=$? at ${SECONDS}s" >> $O/a3b.txt
  du -sb /root/m-spread/*.safetensors | awk '{s+=$1} END {print "weights bytes", s}' >> $O/a3b.txt
fi
echo "===== SUMMARY at ${SECONDS}s"
grep -E "^test |test result|rc=|panicked|left|right" $O/prompt_matmul.txt | head -20
cat $O/weight_memory.txt $O/moe_prefill.txt $O/a3b.txt 2>/dev/null | cut -c1-250
tail -3 $O/a3b.err 2>/dev/null
