#!/usr/bin/env bash
# Session 41 call 2: MoE prompt products dequantized (prompt_matmul::gather) and paced (pacer) on
# the Qwen3-30B-A3B shape (4-bit, random weights): a 4K prompt beside mlx-lm in 2048- and 512-token
# chunks, with MLX_SERVE_PROMPT_MATMUL=0 (MLX's gather_qmm, paced) as the A/B; the tests on CUDA;
# the probe at 8 bits.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
export MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve
timeout 100 $B/prompt_matmul --test-threads 1 > $O/prompt_matmul.txt 2>&1; echo "rc=$? at ${SECONDS}s" >> $O/prompt_matmul.txt
(cd bench && timeout 90 python3 moe_prefill_probe.py --bits 8 --tokens 128,512,2048) > $O/moe_prefill_8bit.txt 2>&1; echo "rc=$? at ${SECONDS}s" >> $O/moe_prefill_8bit.txt
timeout 70 python3 bench/make_moe_model.py qwen3-30b-a3b /root/a3b --embed-scale 100 > /dev/null 2>&1; sync; echo "a3b model at ${SECONDS}s"
gb() { # prompt prefill limit env label
  env $4 timeout $3 python3 bench/generate_bench.py --model /root/a3b --mlx-serve $B/mlx-serve --prompt-tokens $1 \
    --gen-tokens 16 --prefill-size $2 --runs 1 --out "$O/p$1-c$2$5.json" > "$O/p$1-c$2$5.txt" 2>&1
  echo "p$1 c$2 $4 rc $? at ${SECONDS}s"
}
gb 4096 2048 130 MLX_SERVE_X=1 ""
gb 4096 2048 130 MLX_SERVE_PROMPT_MATMUL=0 "-qmm"
gb 4096 512 130 MLX_SERVE_X=1 ""
left=$(( 560 - SECONDS )); echo "left $left"
if [ $left -gt 90 ]; then
  P=$(python3 -c "print(' '.join(['the model token server memory cache layer weight attention']*455))")
  for e in 1 0; do
    MLX_SERVE_PROMPT_MATMUL=$e timeout 40 $B/mlx-serve generate --model /root/a3b --prompt "$P" --max-tokens 32 --ignore-chat-template --ignore-eos \
      --prefill-size 2048 --json 2>/dev/null > $O/ids-$e.json
  done
  python3 -c "
import json
a=json.load(open('$O/ids-1.json'))['generated_token_ids']; b=json.load(open('$O/ids-0.json'))['generated_token_ids']
n=next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), len(a))
print('greedy ids, dequantized vs gather_qmm:', len(a), 'tokens, first difference at', n if n < len(a) else 'none')" > $O/ids.txt 2>&1
fi
echo "===== SUMMARY at ${SECONDS}s"
grep -E "^test |test result|rc=|panicked" $O/prompt_matmul.txt | head -12
cat $O/moe_prefill_8bit.txt | cut -c1-200
for f in "$O"/p*.txt; do echo "== $(basename $f)"; grep -E "^model|^\|" "$f" | head -8; tail -2 "$f" | cut -c1-300; done
cat $O/ids.txt 2>/dev/null
