#!/usr/bin/env bash
# Session 43 call 5 (binary f8cea1d): the server alone at 1 and 8 streams of 4K prompts with the
# GPU's prefill default (2048-token chunks since cc69aae) against --prefill-size 512; session 42's
# call 4 ran out of time on a fresh machine.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=$OUT; mkdir -p ~/.cache/huggingface/hub
[ -f /root/llama/config.json ] || timeout 90 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
timeout 120 $B/mlx-serve generate --model /root/llama --prompt "hello there" --max-tokens 8 --ignore-chat-template > /dev/null 2>&1
echo "warm-up at ${SECONDS}s"
sb() { # label limit args...
  local label=$1 limit=$2; shift 2
  (cd bench && timeout $limit python3 server_bench.py --model /root/llama --mlx-serve $B/mlx-serve --python python3 --no-ref \
    --rounds 1 --label "$label" --out "$O/server-$label.json" "$@") > "$O/server-$label.txt" 2>&1
  echo "server $label rc $? at ${SECONDS}s"
}
sb default 170 --concurrency 1,8 --prompt-tokens 4096 --gen-tokens 64 --cache-reps 1
sb c512 170 --concurrency 1,8 --prompt-tokens 4096 --gen-tokens 64 --cache-reps 1 --ours-args "--prefill-size 512"
echo "===== SUMMARY at ${SECONDS}s"
for f in "$O"/server-*.txt; do echo "== $(basename $f)"; grep -E "^\| (TTFT|decode tok|aggregate)|^\| [18] \||prefill_size" "$f" | head -12 | cut -c1-150; done
