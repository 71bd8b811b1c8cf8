#!/usr/bin/env bash
# Session 55 call 3: is a short prompt's prefill slow through the kernel (call 1: the residual
# form's 16-row products 1.2-4.6 ms each under Nsight Compute in decode_step's prefill, while the
# kernel table's 16-row product takes 11 us, call 2)? `mlx-serve generate` on the Llama-3.1-8B
# shape (4-bit) with a short prompt, the kernel on and off for dense products
# (MLX_SERVE_QMM_MIN_ROWS=33 leaves them to MLX), alternating; then Nsight Compute on a few of the
# prefill's residual-form and 16-row plain products, with their DRAM and system-memory sectors.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
M=/root/models/llama
python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "model built at ${SECONDS}s"
P="the quick brown fox jumps over the lazy dog while seven small birds sing in the old tall tree by the river"
for i in 1 2 3; do
  for min in 1 33; do
    MLX_SERVE_QMM_MIN_ROWS=$min timeout 150 $B/mlx-serve generate --model $M --prompt "$P" --max-tokens 8 > $OUT/gen-$min-$i.txt 2>&1
    echo "min_rows $min run $i rc=$? at ${SECONDS}s: $(grep -iE 'prompt|generation' $OUT/gen-$min-$i.txt | tr '\n' ' ')"
  done
done
timeout 150 ncu --clock-control none -k regex:"quant_matmul_residual_bfloat16_t_4_64_2|quant_matmul_bfloat16_t_4_64_2_2" --launch-count 6 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sectors_aperture_sysmem_op_read.sum,lts__t_sectors_aperture_device_op_read.sum \
  --csv --print-units base $B/decode_step $M --rows 1 --prompt 16 --steps 2 --passes 1 > $OUT/ncu-prefill.csv 2> $OUT/ncu-prefill.err
echo "ncu rc=$? at ${SECONDS}s"
grep '^"' $OUT/ncu-prefill.csv | awk -F'","' 'NR>1{n=$5; sub(/\(.*/,"",n); print NR-1, n, $9, $13, $15}'
xz -9 $OUT/*.csv
echo "ended at ${SECONDS}s"
