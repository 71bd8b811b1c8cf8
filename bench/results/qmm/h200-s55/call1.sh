#!/usr/bin/env bash
# Session 55 call 1: which reduction split (WK warps a block) each one-row product of a Llama
# step wants on an H200. (1) Each dense product of the kernel table's shapes at WK 1..16 (and
# the model's own tiling), every quantized-matmul kernel's GPU time under Nsight Compute (the
# table's own times include launches: a 4096x4096 product is host-bound). (2) The Llama-3.1-8B
# shape's step, its quantized-matmul kernels under Nsight Compute with the grid aimed at
# 1024 / 2048 / 4096 (the default) warps (MLX_SERVE_QMM_TARGET_WARPS). (3) decode_step with
# the steps launched on this thread or a thread of their own (--launch-thread off,on).
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
M=/root/models/llama
( python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "model built at ${SECONDS}s" ) &
summ() {  # kernel name + grid + block -> count x mean us
python3 - "$1" <<'PY'
import csv, sys, re, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')) if r[0] != "ID"]
t, c = collections.defaultdict(float), collections.Counter()
for r in rows:
    n = re.sub(r"\(.*", "", r[4]).replace("custom_kernel_", "") + f" grid{r[8]} block{r[7]}"
    t[n] += float(r[14].replace(",", "")); c[n] += 1
for n in sorted(t, key=lambda n: -t[n]):
    print(f"  {c[n]:5d} x {t[n] / c[n] / 1e3:8.2f} us  {n}")
PY
}
timeout 200 ncu --clock-control none -k regex:quant_matmul --metrics gpu__time_duration.sum --csv --print-units base \
  $B/quant_matmul --rows 1 --graphs 1 --wk 1,2,4,8,16 > $OUT/ncu-table.csv 2> $OUT/ncu-table.err
echo "ncu table rc=$? at ${SECONDS}s"; summ $OUT/ncu-table.csv > $OUT/table.txt; head -60 $OUT/table.txt
wait
for tw in 4096 2048 1024; do
  MLX_SERVE_QMM_TARGET_WARPS=$tw timeout 120 ncu --clock-control none -k regex:quant_matmul --metrics gpu__time_duration.sum --csv --print-units base \
    $B/decode_step $M --rows 1 --prompt 16 --steps 2 --passes 1 > $OUT/ncu-step-$tw.csv 2> $OUT/ncu-step-$tw.err
  echo "ncu step target $tw rc=$? at ${SECONDS}s"; summ $OUT/ncu-step-$tw.csv | tee $OUT/step-$tw.txt
done
timeout 240 $B/decode_step $M --rows 1,8 --prompt 128 --steps 64 --passes 3 --launch-thread off,on > $OUT/launch-thread.txt 2>&1
echo "launch-thread rc=$? at ${SECONDS}s"; grep -vE "^\s*$" $OUT/launch-thread.txt | tail -30
xz -9 $OUT/*.csv
echo "ended at ${SECONDS}s"
