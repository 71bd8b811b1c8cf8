#!/usr/bin/env bash
# Session 48 call 3 (binary 2ae480d): issue 19's N-stream cells on the Qwen3-30B-A3B shape
# (4-bit, random weights, resident) through the server: turbo_bench.py, 4 streams x 32K then
# 4 x 64K, 16-bit cache against `balanced`, a 2048-token warm-up wave; then server starts on
# that model with compile-once and as before it (start_probe.py --off) if time is left.
set -u
source .device/prelude.sh
O=$OUT; M=/root/m-spread; mkdir -p ~/.cache/huggingface/hub; export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "cache files: $(ls /root/ptx 2>/dev/null | wc -l)"
[ -f $M/config.json ] || timeout 200 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null 2>&1; echo "model at ${SECONDS}s"
for cell in "4 32768" "4 65536"; do
  set -- $cell
  left=$((450 - SECONDS)); [ $left -lt 100 ] && { echo "no time for $1 x $2"; continue; }
  (cd bench && timeout $left python3 turbo_bench.py --model $M --mlx-serve $B/mlx-serve --python python3 \
    --out "$O/a3b-turbo-streams$1-$2.json" --gen-tokens 128 --runs 1 --configs fp16,balanced --streams $1 --contexts $2 \
    --warm-context 2048) 2>&1 | tee "$O/a3b-turbo-streams$1-$2.txt" | grep -E "^\[|^\|"
  echo "$1 x $2 ended at ${SECONDS}s"
done
left=$((585 - SECONDS))
if [ $left -ge 90 ]; then
  timeout $left python3 bench/start_probe.py --model $M --mlx-serve $B/mlx-serve --starts 1 --off --ptx-dir /root/ptx 2>&1 | tee "$O/start-probe-a3b.txt"
  for f in /tmp/start-probe-*/mlx-serve-*.log; do echo "== $f"; grep -E "warmed up|CUDA kernels|ERROR|WARN" "$f" | cut -c1-300 | head -4; done
else echo "no time for start_probe ($left s)"; fi
echo "ended at ${SECONDS}s"
