#!/usr/bin/env bash
# Session 49 call 7 (binary fd7b346, a fresh H200): the dense_attend lane loop's defaults as built
# (U 2 up to 4 query heads a KV head, U 4 and the query in shared memory past that, 512 blocks):
# `kv_attend --ragged` on both shapes, 4 rows at 32K and 64K and 16 rows at 32K (the A3B 16x32K
# cell's batch), then the 16-bit and --kv-bits kernels' tests and the split counters' test (call 5 ran
# every `kv::` test with the same turbo_attend).
set -u
source .device/prelude.sh
O=$OUT; export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
L="--layers 8 --steps 20 --repeats 3 --ragged --formats fp16,balanced"
A="--kv-heads 4 --heads 32 --head-dim 128"
run() { local name=$1; shift; echo "== $name"; timeout 90 "$@" > "$O/$name.txt" 2>&1; grep -E "^\| [0-9]" "$O/$name.txt"; echo "   (${SECONDS}s)"; }
run llama-rows4 $B/kv_attend $L --rows 4 --contexts 32768,65536
run a3b-rows4 $B/kv_attend $L $A --rows 4 --contexts 32768,65536
run a3b-rows16 $B/kv_attend $L $A --rows 16 --contexts 32768
for f in the_ split_attention; do
  timeout 150 $B/mlx_serve_lib kv::turbo::tests::$f --test-threads 2 > "$O/tests-$f.txt" 2>&1
  echo "kv::turbo::tests::$f: $(grep -E '^test result' $O/tests-$f.txt)"; grep -E "FAILED|panicked" $O/tests-$f.txt | head -3
done
echo "ended at ${SECONDS}s"
