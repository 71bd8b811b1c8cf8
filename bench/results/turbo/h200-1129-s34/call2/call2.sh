#!/usr/bin/env bash
# Session 34 call 2: the whole Qwen3-30B-A3B shape (4-bit, random weights), one
# row, `balanced` against the 16-bit cache in the same process, passes paired
# (decode_step --turbo-kv fp16,balanced), at 32K and 64K prompt tokens.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; cat .device/commit; date +%T
m=/tmp/m/a3b; python3 bench/make_moe_model.py qwen3-30b-a3b $m > /tmp/make.log 2>&1 || tail -5 /tmp/make.log
date +%T
for pc in "32768 2" "65536 1"; do set -- $pc
  echo "== decode_step A3B prompt $1 passes $2"; date +%T
  timeout ${T:-280} $B/decode_step $m --rows 1 --prompt $1 --warm-prompt 4096 --steps 64 --passes $2 --turbo-kv fp16,balanced --engine-loop 2>&1 | grep -v "^|---"
done
date +%T
