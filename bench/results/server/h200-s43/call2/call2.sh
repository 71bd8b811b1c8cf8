#!/bin/bash
# Session 43 call 2: are the A3B shape's streamed runs token-exact with the resident one on CUDA, and
# is each reproducible? Both prefill through MLX's fused attention (MLX_SERVE_UNFUSED_PREFILL_KEYS=0:
# a streamed model's default, and mlx-lm's), two resident runs then two at 75% (read slabs kept on
# the host, f8cea1d); the second resident run, warmed, gives G4's bound.
source .device/cuda-env.sh
[ -d .device/bin ] || tar -C .device -xJf .device/bin.tar.xz
built_at=$(cat .device/built-at); [ -e "$built_at" ] || { mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; }
export LD_LIBRARY_PATH=$PWD/.device/bin:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1 MLX_SERVE_UNFUSED_PREFILL_KEYS=0
B=.device/bin; M=/root/m-spread; L=$OUT/budgets.log; mkdir -p ~/.cache/huggingface/hub
cat .device/commit > $L
[ -f $M/config.json ] || { timeout 90 python3 bench/make_moe_model.py qwen3-30b-a3b $M --embed-scale 100 > /dev/null; sync; }
echo "model at ${SECONDS}s" >> $L
timeout 150 $B/mlx-serve generate --model $M --prompt "hello there" --max-tokens 8 --ignore-chat-template > /dev/null 2>&1
echo "warm at ${SECONDS}s" >> $L
timeout 420 python3 bench/expert_bench.py --model $M --bin $B/mlx-serve --prompt-kind random --temp 0 \
  --runs resident,resident,75%,75% --prompt-tokens 2048 --gen-tokens 64 --out $OUT/runs.json 2>&1 | grep --line-buffered -v '^$' >> $L
echo "done at ${SECONDS}s" >> $L
echo "===== SUMMARY"
python3 - $L $OUT/runs.json <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print({k: r.get(k) for k in ("run", "decode_tps", "peak_gb", "hit", "decode_router_wait_s", "decode_array_s", "stall_s", "host_staged", "same_tokens")})
    else:
        print(line.rstrip()[:300])
try:
    rows = json.load(open(sys.argv[2]))["rows"]
except Exception as e:
    sys.exit(f"no runs.json: {e}")
for i, a in enumerate(rows):
    for b in rows[i + 1:]:
        tok = next((j for j, (p, q) in enumerate(zip(a["ids"], b["ids"])) if p != q), None)
        val = next((j for j, (p, q) in enumerate(zip(a["logprobs"], b["logprobs"])) if p["logprob"] != q["logprob"]), None)
        print(f"{a['run']} vs {b['run']}: first token differing {tok}, first chosen-token logprob differing {val}")
PY
