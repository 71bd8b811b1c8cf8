#!/usr/bin/env bash
# Session 44 call 5 (binary 09dd6d1): a poor man's profile of the host during A3B decode steps
# (the machine has no perf; cuda-gdb attaches and prints every thread's stack), 16-bit then
# `balanced`, 4K prompt: where a host-bound step's time goes.
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1 M=/root/m-spread
O=$OUT
[ -f $M/config.json ] || timeout 90 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null; echo "model at ${SECONDS}s"
for cfg in fp16 balanced; do
  $B/decode_step $M --rows 1 --prompt 4096 --steps 4000 --passes 1 --turbo-kv $cfg > $O/pmp-$cfg.log 2>&1 &
  pid=$!
  sleep 45
  n=0; t0=$SECONDS
  while [ $((SECONDS - t0)) -lt 150 ] && kill -0 $pid 2>/dev/null; do
    timeout 15 cuda-gdb -q -batch -p $pid -ex "set pagination off" -ex "thread apply all bt 60" >> $O/pmp-$cfg.txt 2>&1
    echo "=== SAMPLE END" >> $O/pmp-$cfg.txt; n=$((n+1))
  done
  echo "$cfg: $n samples at ${SECONDS}s"
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  xz -T4 $O/pmp-$cfg.txt
done
head -c 3000 <(xzcat $O/pmp-fp16.txt.xz)
