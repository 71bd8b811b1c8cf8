#!/usr/bin/env bash
# Session 55 call 2: call 1 found the residual form at 16 rows (RT 2, MT 2: a 16-token prompt's
# output and down projections) taking 1.2-4.6 ms a product in decode_step's prefill, the head's
# 16-row product 14 ms, where the same tiling's normed form (q/k/v) takes 25 us. Is it the
# memory the kernel reads (system memory: managed buffers on the host)? Nsight Compute with the
# kernels' DRAM and system-memory sectors, at a 16-token prompt and 16 decoded rows; the kernel
# table's 16-row products for comparison.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
M=/root/models/llama
( python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "model built at ${SECONDS}s" ) &
ncu --query-metrics --chip gh100 2>/dev/null | grep -iE "aperture_sysmem|aperture_device|aperture_peer" | cut -c1-120 > $OUT/metrics.txt
cat $OUT/metrics.txt | head -20
MET=gpu__time_duration.sum,dram__bytes_read.sum
for m in lts__t_sectors_aperture_sysmem_op_read.sum lts__t_sectors_aperture_device_op_read.sum lts__t_sectors_aperture_sysmem_op_write.sum; do
  grep -q "^${m%.sum}" $OUT/metrics.txt && MET=$MET,$m
done
echo "metrics: $MET"
summ() {  # kernel + grid -> count x mean of each metric
python3 - "$1" <<'PY'
import csv, sys, re, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')) if r[0] != "ID"]
t, c = collections.defaultdict(float), collections.Counter()
for r in rows:
    n = re.sub(r"\(.*", "", r[4]).replace("custom_kernel_", "") + f" grid{r[8]}"
    t[(n, r[12])] += float(r[14].replace(",", "")); c[(n, r[12])] += 1
for k in sorted(t, key=lambda k: (k[0], k[1])):
    print(f"  {c[k]:5d} x {t[k] / c[k]:14.1f} {k[1]:45s} {k[0]}")
PY
}
timeout 150 ncu --clock-control none -k regex:quant_matmul --metrics $MET --csv --print-units base \
  $B/quant_matmul --rows 16 --graphs 1 > $OUT/ncu-table16.csv 2> $OUT/ncu-table16.err
echo "ncu table rc=$? at ${SECONDS}s"; summ $OUT/ncu-table16.csv | grep -v "grid(4, " | tee $OUT/table16.txt
wait
timeout 200 ncu --clock-control none -k regex:quant_matmul --metrics $MET --csv --print-units base \
  $B/decode_step $M --rows 16 --prompt 16 --steps 2 --passes 1 > $OUT/ncu-step16.csv 2> $OUT/ncu-step16.err
echo "ncu step rc=$? at ${SECONDS}s"; summ $OUT/ncu-step16.csv | grep -v "grid(4, " | tee $OUT/step16.txt
tail -3 $OUT/ncu-step16.err
xz -9 $OUT/*.csv
echo "ended at ${SECONDS}s"
