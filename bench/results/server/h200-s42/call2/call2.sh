#!/bin/bash
# Session 42 call 2: G7/G4 at 75% and 50% (call 1's whole table outran its limit on a slower host),
# --stream-experts' prefill attending through the fused kernel by default (cd06a9b); then the
# prompt-path tests on CUDA with the pacing test counting each product's output (a423da3).
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
export LD_LIBRARY_PATH=$PWD/.device/bin:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
M=/root/m-spread; mkdir -p ~/.cache/huggingface/hub
[ -f $M/config.json ] || { timeout 90 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null; sync; }
echo "model at ${SECONDS}s" | tee $OUT/g7.log
timeout 420 python3 bench/expert_bench.py --model $M --bin .device/bin/mlx-serve --prompt-kind random --temp 0 \
  --runs resident,75%,50% --prompt-tokens 2048 --gen-tokens 64 --out $OUT/g7.json 2>&1 | grep --line-buffered -v '^$' >> $OUT/g7.log
echo "budgets rc=$? at ${SECONDS}s" >> $OUT/g7.log
export MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$PWD/.device/bin/mlx-serve
timeout 60 .device/bin/prompt_matmul --test-threads 1 > $OUT/prompt_matmul.txt 2>&1; echo "rc=$? at ${SECONDS}s" >> $OUT/prompt_matmul.txt
echo "===== SUMMARY"
cut -c1-420 $OUT/g7.log
grep -E "^test |test result|rc=|panicked|peak above|paced peak" $OUT/prompt_matmul.txt | head -20
