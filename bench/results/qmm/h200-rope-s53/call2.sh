#!/usr/bin/env bash
# Session 53 call 2 (binary d0a253a; .device/old/decode_step is the same bench built at its
# parent cf731e9): one rope call for queries and keys against two. decode_step on the
# Llama-3.1-8B shape (4-bit, random weights) at 1 and 8 rows, old and new binary in turn,
# three times; then the kernels each commits for the same short run (MLX's CUDA graphs as DOT
# files: kernel nodes counted).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
grep -m1 'model name' /proc/cpuinfo
xz -dc .device/old/decode_step.xz > /root/decode_step_old && chmod +x /root/decode_step_old
M=/root/models/llama
[ -f $M/config.json ] || python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null
echo "model built at ${SECONDS}s"
for round in 1 2 3; do
  for which in old new; do
    bin=$B/decode_step; [ $which = old ] && bin=/root/decode_step_old
    echo "-- round $round, $which (${SECONDS}s)"
    timeout 150 $bin $M --rows 1,8 --prompt 128 --steps 64 --passes 2 > $OUT/steps-$round-$which.txt 2>&1
    grep -E "tok/s|rows" $OUT/steps-$round-$which.txt | tail -6
  done
done
for which in old new; do
  bin=$B/decode_step; [ $which = old ] && bin=/root/decode_step_old
  rm -rf /root/dot-$which; mkdir -p /root/dot-$which
  MLX_SAVE_CUDA_GRAPHS_DOT_FILE=/root/dot-$which/g timeout 120 $bin $M --rows 1 --prompt 128 --steps 8 --passes 1 > $OUT/dot-$which.txt 2>&1
  python3 - /root/dot-$which $which <<'PY'
import glob, re, sys
files = glob.glob(sys.argv[1] + "/*")
kernels = sum(len(re.findall(r'shape="octagon"', open(f, errors="replace").read())) for f in files)
print(f"{sys.argv[2]}: {len(files)} graphs, {kernels} kernel nodes")
PY
done
echo "ended at ${SECONDS}s"
