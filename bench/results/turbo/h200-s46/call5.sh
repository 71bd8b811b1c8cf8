#!/usr/bin/env bash
# Session 46 call 5 (binary 4ee3d51-dirty, turbo_bench.py of 2135956: wave times logged,
# --warm-context): 4 streams x 32K through the server with a 2048-token warm-up wave, to see
# where call 3's cells spent their time (Llama-3.1-8B shape, 4-bit, random weights).
set -u
source .device/prelude.sh
O=$OUT; mkdir -p ~/.cache/huggingface/hub
[ -f /root/llama/config.json ] || timeout 90 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
(cd bench && timeout 150 python3 turbo_bench.py --model /root/llama --mlx-serve $B/mlx-serve --python python3 \
  --out "$O/turbo-streams4-32k.json" --gen-tokens 128 --runs 1 --configs fp16,balanced --streams 4 --contexts 32768 \
  --warm-context 2048) 2>&1 | tee "$O/turbo-streams4-32k.txt" | grep -E "^\[|^\|"
echo "turbo rc at ${SECONDS}s"
for f in /tmp/turbo-bench-*/*.log; do echo "== $f"; tail -5 "$f" | cut -c1-300; done
