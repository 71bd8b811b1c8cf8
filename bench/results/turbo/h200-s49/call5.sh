#!/usr/bin/env bash
# Session 49 call 5 (a fresh H200; binary: main at call 4 plus the dense_attend lane loop that
# reads U positions a lane an iteration and, past 4 query heads a KV head, the query from shared
# memory): the 16-bit attention for rows of other lengths (`kv_attend --ragged`, 4 rows, 32K and
# 64K) at each (MLX_SERVE_DENSE_UNROLL, MLX_SERVE_DENSE_QUERY_REGS), Llama-3.1-8B and
# Qwen3-30B-A3B attention shapes (call 2 has the loop before: 5.60 / 5.28 ms at 64K); then the
# library's `kv::` tests with the defaults (U 2, query heads in registers up to 4) and with U 4.
set -u
source .device/prelude.sh
O=$OUT; export MLX_PTX_CACHE_DIR=/root/ptx
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
L="--rows 4 --contexts 32768,65536 --layers 8 --steps 20 --repeats 2 --ragged"
A="$L --kv-heads 4 --heads 32 --head-dim 128"
run() { local name=$1; shift; echo "== $name"; timeout 60 env "$@" > "$O/$name.txt" 2>&1; grep -E "^\| [0-9]" "$O/$name.txt"; echo "   (${SECONDS}s)"; }
run llama-default $B/kv_attend $L --formats fp16,balanced
for v in 1,8 2,1 4,4 4,1; do run llama-u${v/,/-q} MLX_SERVE_DENSE_UNROLL=${v%,*} MLX_SERVE_DENSE_QUERY_REGS=${v#*,} $B/kv_attend $L --formats fp16; done
run llama-default-512 MLX_SERVE_TURBO_BLOCKS=512 $B/kv_attend $L --formats fp16
run a3b-default $B/kv_attend $A --formats fp16,balanced
for v in 1,4 2,8 4,4; do run a3b-u${v/,/-q} MLX_SERVE_DENSE_UNROLL=${v%,*} MLX_SERVE_DENSE_QUERY_REGS=${v#*,} $B/kv_attend $A --formats fp16; done
run a3b-default-512 MLX_SERVE_TURBO_BLOCKS=512 $B/kv_attend $A --formats fp16
t0=$SECONDS
timeout $((570 - SECONDS)) $B/mlx_serve_lib kv:: --test-threads 2 > "$O/kv-lib-tests.txt" 2>&1 &
MLX_SERVE_DENSE_UNROLL=4 timeout $((570 - SECONDS)) $B/mlx_serve_lib kv::turbo::tests::the_ --test-threads 2 > "$O/kv-lib-tests-u4.txt" 2>&1
wait
for f in kv-lib-tests kv-lib-tests-u4; do echo "$f: $(grep -E '^test result' $O/$f.txt)"; grep -E "FAILED|panicked" $O/$f.txt | head -5; done
echo "tests ended at ${SECONDS}s ($((SECONDS - t0)) s)"
