#!/usr/bin/env bash
# Session 45 call 3 (binary 09dd6d1): Nsight Compute's GPU time of the attention kernel alone
# (kv_attend, balanced, Llama-3.1-8B shape, 4 layers, 1 row) at 64K and 32K positions, by
# attention block target (256, 512), for the built-in kernel and for metal-kernels/ as edited
# (one 8-byte table load per centroid pair; the value codes' third bits interleaved once per
# position pair); the copy-only variant (bench/turbo_variants.py nocompute, made from the edited
# sources: their copies are the built-in ones) at 64K; the
# attention kernel's unit tests with the edited sources first.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader
MLX_SERVE_TURBO_KERNELS=$PWD/metal-kernels timeout 150 $B/mlx_serve_lib --test-threads 1 attention_in_the_rotated_basis \
  every_shape_the_presets a_row_attends_alike blocks_equal_one_call > "$O/tests-edited.txt" 2>&1
echo "tests rc $? at ${SECONDS}s: $(grep 'test result' "$O/tests-edited.txt")"; grep -E "FAILED|panicked" "$O/tests-edited.txt" | head -5
python3 bench/turbo_variants.py /tmp/variants > /dev/null
t() { # tag kernels-dir blocks context
  local src=(env -u MLX_SERVE_TURBO_KERNELS); [ "$2" = builtin ] || src=(env MLX_SERVE_TURBO_KERNELS=$2)
  "${src[@]}" MLX_SERVE_TURBO_BLOCKS=$3 KV_ATTEND_FORCE_KERNELS=1 timeout 90 ncu --clock-control none --csv \
    --kernel-name regex:turbo_attend --metrics gpu__time_duration.sum --print-units base \
    $B/kv_attend --contexts $4 --formats balanced --layers 4 --steps 3 > "$O/ncu-$1-$3-$4.csv" 2> /dev/null
  echo "$1 blocks $3 context $4 at ${SECONDS}s: $(python3 bench/ncu_times.py "$O/ncu-$1-$3-$4.csv" | grep bfloat16 | cut -d'|' -f3-5)"
}
for ctx in 65536 32768; do
  for blocks in 256 512; do
    t builtin builtin $blocks $ctx
    t edited $PWD/metal-kernels $blocks $ctx
  done
done
t nocompute /tmp/variants/nocompute 256 65536
t nocompute /tmp/variants/nocompute 512 65536
