#!/usr/bin/env bash
# Session 54 call 4 (binary: the kernel loading a k-block ahead only at one tile of rows, MT 1;
# call 3's version failed to launch larger tilings, too many registers): each quantized-matmul
# kernel's GPU time in the same short decode_step run (Llama-3.1-8B shape, 4-bit, 1 row), the
# kernel before (.device/old, 5d212b1) and this one, under Nsight Compute with only the
# quantized-matmul kernels profiled, nothing else running.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models /root/old
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
xz -dc .device/old/decode_step.xz > /root/old/decode_step && chmod +x /root/old/decode_step
M=/root/models/llama
[ -f $M/config.json ] || python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null
echo "model built at ${SECONDS}s"
for which in old new; do
  bin=$B/decode_step; [ $which = old ] && bin=/root/old/decode_step
  timeout 140 ncu --clock-control none -k regex:quant_matmul --metrics gpu__time_duration.sum --csv --print-units base \
    $bin $M --rows 1 --prompt 16 --steps 2 --passes 1 > $OUT/ncu-$which.csv 2> $OUT/ncu-$which.err
  echo "ncu $which rc=$? at ${SECONDS}s, $(grep -c gpu__time_duration $OUT/ncu-$which.csv) kernels"
  python3 - $OUT/ncu-$which.csv <<'PY'
import csv, sys, re, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')) if r[0] != "ID"]
t, c = collections.defaultdict(float), collections.Counter()
for r in rows:
    n = re.sub(r"\(.*", "", r[4]).replace("mlx::custom_kernel_", "")
    t[n] += float(r[14].replace(",", "")); c[n] += 1
for n in sorted(t, key=lambda n: -t[n]):
    print(f"  {c[n]:5d} x {t[n] / c[n] / 1e3:8.2f} us  {n}")
PY
done
xz -9 $OUT/ncu-*.csv
echo "ended at ${SECONDS}s"
