#!/usr/bin/env bash
# Session 44 call 4 (binary 09dd6d1): where an A3B `balanced` step's extra host time goes, if the
# machine has a sampling profiler; then more paired passes of decode_step at 32K.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1 M=/root/m-spread
O=$OUT
for t in perf gdb py-spy valgrind ltrace strace nsys ncu; do printf '%s: %s\n' $t "$(command -v $t || echo no)"; done
python3 -c "import torch; print('torch', torch.__version__)" 2>&1 | tail -1
