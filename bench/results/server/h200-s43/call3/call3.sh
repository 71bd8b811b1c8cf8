#!/bin/bash
# Session 43 call 3: mlx-lm's own greedy decode of the A3B bench model, three times in one process
# (call 2 found our resident runs parting from each other at token 22 on CUDA).
source .device/cuda-env.sh
export PYTHONUNBUFFERED=1 M=/root/m-spread
[ -f $M/config.json ] || { timeout 90 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null; sync; }
timeout 400 python3 bench/results/server/h200-s43/call3/mlxlm_repeat.py $M 2>&1 | grep --line-buffered -v "^$" | tee $OUT/mlxlm_repeat.txt
