#!/usr/bin/env bash
# Session 55 call 4 (binary 3c12d84: a dense product's block takes at least 4 warps): the
# Llama-3.1-8B shape's one-row step under Nsight Compute (quantized-matmul kernels only; call 1
# is the before: head 129.1 us at one warp a block), the head's 16-row product at 2 and 4 warps
# (the kernel table, plain 16-row products only), then decode_step at 1 and 8 rows (call 1:
# 302 and 1879 tok/s).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
M=/root/models/llama
( python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "model built at ${SECONDS}s" ) &
summ() {  # kernel name + grid + block -> count x median us (from the $2-th part on: 2 = the second half)
python3 - "$1" "${2:-1}" <<'PY'
import csv, sys, re, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')) if r[0] != "ID"]
t = collections.defaultdict(list)
for r in rows[len(rows) - len(rows) // int(sys.argv[2]):]:
    n = re.sub(r"\(.*", "", r[4]).replace("custom_kernel_", "") + f" grid{r[8]} block{r[7]}"
    t[n].append(float(r[14].replace(",", "")))
for n in sorted(t, key=lambda n: -sum(t[n])):
    v = sorted(t[n]); print(f"  {len(v):5d} x {v[len(v)//2] / 1e3:8.2f} us  {n}")
PY
}
timeout 120 ncu --clock-control none -k regex:"quant_matmul_bfloat16_t_4_64_2_2" --metrics gpu__time_duration.sum --csv --print-units base \
  $B/quant_matmul --rows 16 --graphs 1 --wk 2,4 > $OUT/ncu-table16.csv 2> $OUT/ncu-table16.err
echo "ncu table rc=$? at ${SECONDS}s"; grep -E "lm_head" $OUT/ncu-table16.csv | head; summ $OUT/ncu-table16.csv | grep "grid(4008" 
wait
timeout 120 ncu --clock-control none -k regex:quant_matmul --metrics gpu__time_duration.sum --csv --print-units base \
  $B/decode_step $M --rows 1 --prompt 16 --steps 2 --passes 1 > $OUT/ncu-step.csv 2> $OUT/ncu-step.err
echo "ncu step rc=$? at ${SECONDS}s"; summ $OUT/ncu-step.csv 2 | grep -v "grid(4, "
timeout 200 $B/decode_step $M --rows 1,8 --prompt 128 --steps 64 --passes 3 > $OUT/steps.txt 2>&1
echo "decode_step rc=$? at ${SECONDS}s"; grep -E "^\| [18] |median" $OUT/steps.txt
xz -9 $OUT/*.csv
echo "ended at ${SECONDS}s"
