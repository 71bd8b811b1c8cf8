#!/usr/bin/env bash
# Session 54 call 2 (binary ea44ee8 = 5d212b1's code): is one Llama stream's step bound by
# the host or by the GPU's kernels? decode_step on the Llama-3.1-8B shape (4-bit, random
# weights) as usual, then the same short run under Nsight Compute with only each kernel's GPU
# time collected (--clock-control none), every kernel of the process, written as CSV.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
grep -m1 'model name' /proc/cpuinfo
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"; $NCU --version | tail -1
M=/root/models/llama
[ -f $M/config.json ] || python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null
echo "model built at ${SECONDS}s"
timeout 200 $B/decode_step $M --rows 1 --prompt 128 --steps 64 --passes 2 > $OUT/steps.txt 2>&1
grep -E "^\| 1" $OUT/steps.txt; echo "steps done at ${SECONDS}s"
timeout 250 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  $B/decode_step $M --rows 1 --prompt 16 --steps 4 --passes 1 > $OUT/ncu.csv 2> $OUT/ncu.err
echo "ncu rc=$? at ${SECONDS}s, $(grep -c gpu__time_duration $OUT/ncu.csv) kernels"; tail -3 $OUT/ncu.err
xz -9 $OUT/ncu.csv
echo "ended at ${SECONDS}s"
