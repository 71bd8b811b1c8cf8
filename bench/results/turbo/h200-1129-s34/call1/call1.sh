#!/usr/bin/env bash
# Session 34 call 1: the launch-bounds branch (turbo_attend_bounded) on CUDA:
# the library's kv:: tests and quant_kernel's five tests as parallel processes
# (correctness; the GPU idles while NVRTC compiles), then ncu GPU time per kernel
# at 4K and 32K (A3B attention shape), then kv_attend A3B wall times.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; cat .device/commit; date +%T
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
export MLX_SERVE_PYTHON=python3
( timeout 330 $B/mlx_serve_lib kv:: --test-threads 1 > /tmp/kv.txt 2>&1; echo "kv rc $?" >> /tmp/kv.txt ) &
for t in dense_matches_mlx decode_batches_take_the_kernel every_tiling_matches_mlx gathered_matches_mlx unsupported_calls_fall_back; do
  ( timeout 400 $B/quant_kernel --exact $t --nocapture > /tmp/qk-$t.txt 2>&1; echo "rc $?" >> /tmp/qk-$t.txt ) &
done
wait
date +%T
echo "== kv:: tests"; grep -E "FAILED|panicked|test result|kv rc" /tmp/kv.txt | head -20
for f in /tmp/qk-*.txt; do echo "== $f"; grep -E "test result|panicked|differs|FAILED|^rc" $f | head -5; grep -c agrees $f; done
cp /tmp/kv.txt $O/kv-tests.txt
for c in 4096 32768; do
  echo "== ncu bounded $c"; date +%T
  timeout 100 ncu --csv --metrics gpu__time_duration.sum --print-units base $B/kv_attend --contexts $c --formats fp16,balanced --layers 4 --steps 3 --kv-heads 4 --heads 32 > /tmp/ncu.csv 2>/tmp/ncu.err || tail -3 /tmp/ncu.err
  python3 bench/ncu_times.py /tmp/ncu.csv
done
for r in 1 2; do
  echo "== kv_attend A3B round $r"; date +%T
  timeout 100 $B/kv_attend --contexts 4096,32768,65536 --formats fp16,balanced --layers 48 --kv-heads 4 --heads 32 --steps 20 > $O/a3b-$r.md 2>&1; grep -E "^\| [0-9]|in use" $O/a3b-$r.md
done
date +%T
