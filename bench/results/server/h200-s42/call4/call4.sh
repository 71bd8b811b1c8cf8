#!/usr/bin/env bash
# Session 42 call 4 (binary cc69aae): the prefill default's unit test on CUDA (2048 on a GPU);
# the server alone at 1 and 8 streams of 4K prompts with the new default chunk against
# --prefill-size 512; then one 75% streamed run of the A3B shape with the trace log, its decode
# passes timed layer by layer (where G4's time goes).
set -u
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
timeout 90 python3 bench/make_model.py llama-3.1-8b /root/llama --dtype bfloat16 --bits 4 > /dev/null 2>&1; echo "llama model at ${SECONDS}s"
export MLX_SERVE_PYTHON=python3 MLX_SERVE_BIN=$B/mlx-serve
timeout 60 $B/mlx_serve_lib cli::tests > $O/cli-test.txt 2>&1; echo "rc=$? at ${SECONDS}s" >> $O/cli-test.txt
timeout 100 $B/mlx-serve generate --model /root/llama --prompt "hello there" --max-tokens 8 --ignore-chat-template > /dev/null 2>&1
echo "warm-up at ${SECONDS}s"
sb() { # label limit args...
  local label=$1 limit=$2; shift 2
  (cd bench && timeout $limit python3 server_bench.py --model /root/llama --mlx-serve $B/mlx-serve --python python3 --no-ref \
    --rounds 1 --label "$label" --out "$O/server-$label.json" "$@") > "$O/server-$label.txt" 2>&1
  echo "server $label rc $? at ${SECONDS}s"
}
sb default 90 --concurrency 1,8 --prompt-tokens 4096 --gen-tokens 64 --cache-reps 1
sb c512 90 --concurrency 1,8 --prompt-tokens 4096 --gen-tokens 64 --cache-reps 1 --ours-args "--prefill-size 512"
timeout 100 python3 bench/make_moe_model.py qwen3-30b-a3b /root/m-spread --embed-scale 100 > /dev/null 2>&1; sync
echo "a3b model at ${SECONDS}s"
left=$(( 560 - SECONDS ))
if [ $left -gt 120 ]; then
  MLX_SERVE_LOG_LEVEL=trace timeout $left python3 bench/expert_bench.py --model /root/m-spread --bin $B/mlx-serve --prompt-kind random \
    --temp 0 --no-probe --runs 75% --prompt-tokens 2048 --gen-tokens 24 --out $O/g4-trace.json > $O/g4-trace.log 2>&1
  echo "trace run rc $? at ${SECONDS}s"
  python3 bench/expert_timeline.py $O/g4-trace.log > $O/g4-timeline.txt 2>&1
  xz -T4 $O/g4-trace.log
fi
echo "===== SUMMARY at ${SECONDS}s"
grep -E "^test |test result|rc=|panicked" $O/cli-test.txt | head
for f in "$O"/server-*.txt; do echo "== $(basename $f)"; grep -E "^\| (TTFT|decode tok|aggregate)|^\| [18] \|" "$f" | head -12 | cut -c1-150; done
grep '"run"' $O/g4-trace.log* 2>/dev/null | cut -c1-400; head -c 2500 $O/g4-timeline.txt 2>/dev/null; echo; tail -c 2500 $O/g4-timeline.txt 2>/dev/null
