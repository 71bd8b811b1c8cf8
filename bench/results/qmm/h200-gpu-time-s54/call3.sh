#!/usr/bin/env bash
# Session 54 call 3: the quantized-matmul kernel loading each k-block's weights while it
# multiplies the one before (the first before the norm prologue), against the kernel before
# it (.device/old: quant_matmul and decode_step built at 5d212b1). The kernel's 13 tests
# against MLX as 4 shards each in the background (a fresh machine compiles every instance);
# meanwhile each kernel's GPU time in a short decode_step run under Nsight Compute (only the
# quantized-matmul kernels profiled); after the tests, decode_step old and new in turn.
set -u
source .device/prelude.sh
export MLX_PTX_CACHE_DIR=/root/ptx
mkdir -p ~/.cache/huggingface/hub /root/models /root/old
nvidia-smi --query-gpu=name --format=csv,noheader; date -u; echo "binary $(cat .device/commit)"
grep -m1 'model name' /proc/cpuinfo
for b in decode_step quant_matmul; do xz -dc .device/old/$b.xz > /root/old/$b && chmod +x /root/old/$b; done
mkdir -p $OUT/tests
(SHARDS=4 BIN_DIR=$B OUT=$OUT/tests bash bench/quant_kernel_gpu.sh tests > $OUT/tests.txt 2>&1; echo "tests ended at ${SECONDS}s" >> $OUT/tests.txt) &
tests=$!
M=/root/models/llama
[ -f $M/config.json ] || python3 bench/make_model.py llama-3.1-8b $M --dtype bfloat16 --bits 4 > /dev/null
echo "model built at ${SECONDS}s"
for which in old new; do
  bin=$B/decode_step; [ $which = old ] && bin=/root/old/decode_step
  timeout 170 ncu --clock-control none -k regex:quant_matmul --metrics gpu__time_duration.sum --csv --print-units base \
    $bin $M --rows 1 --prompt 16 --steps 4 --passes 1 > $OUT/ncu-$which.csv 2> $OUT/ncu-$which.err
  echo "ncu $which rc=$? at ${SECONDS}s, $(grep -c gpu__time_duration $OUT/ncu-$which.csv) kernels"
done
wait $tests; cat $OUT/tests.txt
for which in old new; do
  bin=$B/decode_step; [ $which = old ] && bin=/root/old/decode_step
  timeout 100 $bin $M --rows 1,8 --prompt 128 --steps 64 --passes 2 > $OUT/steps-$which.txt 2>&1
  echo "-- $which (${SECONDS}s)"; grep -E "^\| [18] " $OUT/steps-$which.txt
done
xz -9 $OUT/ncu-*.csv; tar -C $OUT -czf $OUT/tests-logs.tgz tests && rm -rf $OUT/tests
echo "ended at ${SECONDS}s"
