#!/usr/bin/env bash
# Session 37 call 4: after (HEAD: short prompt-cache hits no longer keep a burst's prompts out of
# their shared call) against before (aabefc9), the server alone, 1 and 8 streams, Llama-3.1-8B
# shape 4-bit; after, before, after.
set -u
cd "$(dirname "$0")/.."
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
B=$PWD/.device/bin; export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
xz -dc .device/mlx-serve-aabefc9.xz > $B/mlx-serve-before; chmod +x $B/mlx-serve-before
O=${OUT:-/tmp/out}; mkdir -p "$O" ~/.cache/huggingface/hub
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; grep -m1 'model name' /proc/cpuinfo; cat .device/commit; } | tee "$O/machine.txt"
date +%T
timeout 90 python3 bench/make_model.py llama-3.1-8b /tmp/llama --dtype bfloat16 --bits 4 > /tmp/llama-build.txt 2>&1 || tail -5 /tmp/llama-build.txt
date +%T
sb() { # name binary
  timeout 110 python3 bench/server_bench.py --model /tmp/llama --mlx-serve "$2" --python python3 --no-ref \
    --concurrency 1,8 --prompt-tokens 128 --gen-tokens 128 --rounds 1 --label "$1" \
    --out "$O/$1.json" > "$O/$1.txt" 2>&1
  echo "$1 rc $? $(date +%T)"
}
sb after1 $B/mlx-serve
sb before1 $B/mlx-serve-before
left=$(( 330 - SECONDS )); echo "left $left"
[ $left -gt 75 ] && sb after2 $B/mlx-serve
python3 - "$O" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    d = json.loads(f.read_text())
    for s in d.get("sessions", []):
        for c, l in s["levels"].items():
            for w in l["waves"]:
                r = w["requests"]; t0 = min(x["start"] for x in r)
                print(f.stem, c, "agg", round(w["aggregate_tps"], 1), "firsts", sorted(round((x["first"] - t0) * 1e3) for x in r))
PY
for n in after1 before1 after2; do
  [ -f "$O/$n.txt" ] || continue
  echo "== $n"; grep -E "^\| (1|8) \|" "$O/$n.txt"; grep -E "^\| (TTFT \(ms\)|aggregate tok/s|decode tok/s per stream) " "$O/$n.txt"
done
