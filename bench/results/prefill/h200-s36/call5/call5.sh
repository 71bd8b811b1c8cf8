#!/usr/bin/env bash
# Session 36 call 5: eight streams through the server with prompts of one length seen in the
# warm-up (as bench/server_bench.py sends them), 128 tokens in, 128 out: the prefill as before
# this session ("base": MLX_SERVE_UNFUSED_PREFILL_KEYS=0, --prompt-concurrency 1) against the
# defaults of 711e1b4 (composed prefill attention, prompts prefilled together, idle turns taking
# a burst whole), one binary, bench/ab.py.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p "$O"
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
printf '#!/bin/sh\nMLX_SERVE_UNFUSED_PREFILL_KEYS=0 exec "%s/mlx-serve" "$@" --prompt-concurrency 1\n' "$B" > "$B/base"
printf '#!/bin/sh\nexec "%s/mlx-serve" "$@"\n' "$B" > "$B/new"
chmod +x "$B/base" "$B/new"
date +%T
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
date +%T
timeout $(( ${CALL_LIMIT:-300} - SECONDS )) python3 bench/ab.py --model /tmp/llama --build base="$B/base" --build new="$B/new" --configs default \
  --contexts 128 --concurrency 8 --gen-tokens 128 --repeats 1 --out "$O/ab.json" > "$O/ab.txt" 2> "$O/ab-log.txt"
echo "ab rc $?"; date +%T
grep -E "tok/s" "$O/ab-log.txt" | cut -c1-160
python3 -c "
import json; r=json.load(open('$O/ab.json'))
for c in r['cells']:
    print(c['context'], c['concurrency'], c['build'], 'aggregate %.1f decode/stream %.1f ttft %.3f rows %.2f' % (c['aggregate_tps'] or 0, c['decode_tps'] or 0, c['ttft_s'] or 0, c['rows_per_step'] or 0))
"
