#!/usr/bin/env bash
# Session 42 call 3 (Llama-3.1-8B shape 4-bit, random weights): where mlx-serve's greedy tokens first
# differ from mlx-lm's on a 4K prompt in 512-token chunks and how far mlx-lm's logits put its token
# ahead of ours there; the server alone at 1 and 8 streams of 143-token chats (issue 15's 8-stream
# goal, 4.95x in session 37); then 1 and 8 streams of 4K prompts in 512- and 2048-token chunks.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
rm -rf /root/m-spread  # call 2's model, if this machine ran it
timeout 90 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
timeout 150 $B/mlx-serve generate --model /root/llama --prompt "hello there" --max-tokens 8 --ignore-chat-template > /dev/null 2>&1
echo "warm-up at ${SECONDS}s"
timeout 110 python3 bench/generate_bench.py --model /root/llama --mlx-serve $B/mlx-serve --prompt-tokens 4096 \
  --gen-tokens 16 --prefill-size 512 --runs 1 --out "$O/llama-c512.json" > "$O/llama-c512.txt" 2>&1
echo "generate_bench rc $? at ${SECONDS}s"
sb() { # label limit args...
  local label=$1 limit=$2; shift 2
  (cd bench && timeout $limit python3 server_bench.py --model /root/llama --mlx-serve $B/mlx-serve --python python3 --no-ref \
    --rounds 1 --label "$label" --out "$O/server-$label.json" "$@") > "$O/server-$label.txt" 2>&1
  echo "server $label rc $? at ${SECONDS}s"
}
sb chat 100 --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128
left=$(( 570 - SECONDS ))
if [ $left -gt 180 ]; then
  sb c512 $(( left / 2 )) --concurrency 1,8 --prompt-tokens 4096 --gen-tokens 64 --cache-reps 1 --ours-args "--prefill-size 512"
  sb c2048 $(( 570 - SECONDS )) --concurrency 1,8 --prompt-tokens 4096 --gen-tokens 64 --cache-reps 1 --ours-args "--prefill-size 2048"
fi
echo "===== SUMMARY at ${SECONDS}s"
grep -E "^model|^\|" "$O/llama-c512.txt" | head -8; tail -3 "$O/llama-c512.txt" | cut -c1-300
for f in "$O"/server-*.txt; do echo "== $(basename $f)"; grep -E "^\||length check" "$f" | head -24 | cut -c1-150; done
