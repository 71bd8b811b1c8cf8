#!/usr/bin/env bash
# Session 49 call 6, the machine and binary of call 5: the dense_attend lane loop's variants with
# 512 blocks targeted (MLX_SERVE_TURBO_BLOCKS), 3 repeats, both shapes; then its tests
# (`kv::turbo::tests::the_`) with 512 blocks and U 2 or 4.
set -u
source .device/prelude.sh
O=$OUT; export MLX_PTX_CACHE_DIR=/root/ptx
L="--rows 4 --contexts 32768,65536 --layers 8 --steps 20 --repeats 3 --ragged --formats fp16"
A="$L --kv-heads 4 --heads 32 --head-dim 128"
run() { local name=$1; shift; echo "== $name"; timeout 60 env MLX_SERVE_TURBO_BLOCKS=512 "$@" > "$O/$name.txt" 2>&1; grep -E "^\| [0-9]" "$O/$name.txt"; echo "   (${SECONDS}s)"; }
for v in 2,4 4,4 4,1; do run llama-512-u${v/,/-q} MLX_SERVE_DENSE_UNROLL=${v%,*} MLX_SERVE_DENSE_QUERY_REGS=${v#*,} $B/kv_attend $L; done
for v in 2,4 4,4 2,8; do run a3b-512-u${v/,/-q} MLX_SERVE_DENSE_UNROLL=${v%,*} MLX_SERVE_DENSE_QUERY_REGS=${v#*,} $B/kv_attend $A; done
for u in 2 4; do MLX_SERVE_TURBO_BLOCKS=512 MLX_SERVE_DENSE_UNROLL=$u timeout 120 $B/mlx_serve_lib kv::turbo::tests::the_ --test-threads 2 > "$O/tests-512-u$u.txt" 2>&1 & done
wait
for u in 2 4; do echo "512 u$u: $(grep -E '^test result' $O/tests-512-u$u.txt)"; grep -E "FAILED|panicked" $O/tests-512-u$u.txt | head -3; done
echo "ended at ${SECONDS}s"
