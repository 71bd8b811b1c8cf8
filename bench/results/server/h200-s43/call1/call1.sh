#!/bin/bash
# Session 43 call 1: streamed experts' read slabs kept in host memory for the GPU (CUDA managed
# memory advised host-preferred and GPU-mapped, reader.rs) against leaving them to migrate
# (MLX_SERVE_EXPERT_STAGING=managed), at 75% and 50%, A3B shape 4-bit, 2048-token random prompt,
# 64 greedy tokens; the new unit tests on CUDA first.
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
export LD_LIBRARY_PATH=$PWD/.device/bin:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
B=.device/bin; M=/root/m-spread; L=$OUT/budgets.log; mkdir -p ~/.cache/huggingface/hub
cat .device/commit > $L
[ -f $M/config.json ] || { timeout 90 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null; sync; }
echo "model at ${SECONDS}s" >> $L
timeout 60 $B/managed_memory > $OUT/tests.txt 2>&1; echo "managed_memory rc=$?" >> $OUT/tests.txt
timeout 60 $B/mlx_serve_lib experts::reader > $OUT/tests.txt.2 2>&1; echo "reader rc=$?" >> $OUT/tests.txt.2; cat $OUT/tests.txt.2 >> $OUT/tests.txt; rm $OUT/tests.txt.2
echo "tests at ${SECONDS}s" >> $L
# Warm-up: MLX's CUDA kernels compiled before any timed run.
timeout 150 $B/mlx-serve generate --model $M --prompt "hello there" --max-tokens 8 --ignore-chat-template > /dev/null 2>&1
echo "warm at ${SECONDS}s" >> $L
bench() {  # staging runs
  echo "== staging $1, runs $2 at ${SECONDS}s" >> $L
  MLX_SERVE_EXPERT_STAGING=$1 timeout 200 python3 bench/expert_bench.py --model $M --bin $B/mlx-serve --prompt-kind random --temp 0 \
    --runs $2 --prompt-tokens 2048 --gen-tokens 64 --out $OUT/$1-${2//[%,]/_}.json 2>&1 | grep --line-buffered -v '^$' >> $L
}
bench host resident,75%
bench managed 75%
bench host 50%
bench managed 50%
echo "done at ${SECONDS}s" >> $L
echo "===== SUMMARY"
grep -E "^test |test result|rc=|panicked" $OUT/tests.txt | head -20
python3 - $L <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print({k: r.get(k) for k in ("run", "decode_tps", "peak_gb", "hit", "decode_router_wait_s", "decode_array_s", "stall_s", "host_staged", "same_tokens", "tokens_match")})
    else:
        print(line.rstrip()[:300])
PY
