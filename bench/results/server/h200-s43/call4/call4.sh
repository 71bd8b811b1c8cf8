#!/bin/bash
# Session 43 call 4 (binary f8cea1d): one traced 75% run of the A3B shape with read slabs kept on the
# host, its decode layers' router waits grouped by the misses of the layer before
# (bench/expert_timeline.py): session 42's trace, with slabs left to migrate, had 0.70 / 1.70 /
# 2.50 / 3.30 ms after 0 / 1 / 2 / 3+ misses.
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1 M=/root/m-spread
O=$OUT; mkdir -p ~/.cache/huggingface/hub
[ -f $M/config.json ] || { timeout 90 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null; sync; }
echo "model at ${SECONDS}s"
timeout 150 $B/mlx-serve generate --model $M --prompt "hello there" --max-tokens 8 --ignore-chat-template > /dev/null 2>&1
echo "warm at ${SECONDS}s"
MLX_SERVE_LOG_LEVEL=trace timeout 300 python3 bench/expert_bench.py --model $M --bin $B/mlx-serve --prompt-kind random \
  --temp 0 --no-probe --runs 75% --prompt-tokens 2048 --gen-tokens 24 --out $O/g4-trace.json > $O/g4-trace.log 2>&1
echo "trace run rc $? at ${SECONDS}s"
python3 bench/expert_timeline.py $O/g4-trace.log > $O/g4-timeline.txt 2>&1
xz -T4 $O/g4-trace.log
echo "===== SUMMARY at ${SECONDS}s"
xzcat $O/g4-trace.log.xz | grep '"run"' | cut -c1-600; head -c 3000 $O/g4-timeline.txt; echo; tail -c 2500 $O/g4-timeline.txt
