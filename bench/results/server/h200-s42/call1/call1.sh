#!/bin/bash
# Session 42 call 1: G7/G4 rerun (warm budgets) at cd06a9b, whose --stream-experts prefill attends
# through the fused kernel by default; then the prompt-path tests on CUDA (4b6a824's bound assertions).
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
mkdir -p $OUT/experts
start=$(date +%s)
timeout 460 bash bench/expert_gpu.sh warm budgets > $OUT/budgets.log 2>&1
echo "budgets rc=$? in $(( $(date +%s) - start )) s" >> $OUT/budgets.log
cp /tmp/experts-out/*.json $OUT/experts/ 2>/dev/null
export MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$PWD/.device/bin/mlx-serve
timeout 110 .device/bin/prompt_matmul --test-threads 1 > $OUT/prompt_matmul.txt 2>&1; echo "rc=$?" >> $OUT/prompt_matmul.txt
echo "===== SUMMARY"
cut -c1-330 $OUT/budgets.log
grep -E "^test |test result|rc=|panicked|left|right" $OUT/prompt_matmul.txt | head -20
