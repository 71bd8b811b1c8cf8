#!/usr/bin/env bash
# Session 45 call 6 (binary 09dd6d1): the kv::turbo library tests on CUDA with the attention block
# target the code now defaults to for the Llama shape (MLX_SERVE_TURBO_BLOCKS=448).
source .device/cuda-env.sh; [ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
MLX_SERVE_TURBO_BLOCKS=448 timeout 165 $B/mlx_serve_lib kv::turbo --test-threads 1 > $OUT/tests-blocks448.txt 2>&1
echo rc $?; grep -E "test result|FAILED|panicked" $OUT/tests-blocks448.txt | head
