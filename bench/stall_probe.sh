#!/usr/bin/env bash
# Times the first prompt-cache hits of a fresh mlx-serve on a Gemma-4-26B-A4B-shaped model (two
# system prompts, a cold request and a hit each), sampling the threads (top; stacks where gdb is
# installed) during the first hit, and lists the files written during it (MLX CUDA kernel compiles
# leave .ptx files under /tmp/mlx/VERSION/ptx). On the GPU machine: bash bench/stall_probe.sh (OUT set by the
# device tool), after scripts/device-bundle.sh or a .device/bin.tar.xz beside MLX's CUDA bundle.
set -u
source .device/cuda-env.sh
tar -C .device -xJf .device/bin.tar.xz
rm -f /tmp/cold[01] /tmp/hit[01]
which gdb eu-stack perf 2>/dev/null
[ -f /tmp/g4/config.json ] || python3 bench/make_moe_model.py gemma-4-26b-a4b /tmp/g4 >/dev/null
.device/bin/mlx-serve --model /tmp/g4 --port 8123 > $OUT/server.log 2>&1 &
PID=$!
for i in $(seq 600); do curl -sf localhost:8123/health >/dev/null && break; sleep 1; done
python3 - <<'PY' &
import httpx, time, json
W = "the model token server memory cache layer weight attention value key query stream".split()
def ask(system, q):
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}], "max_tokens": 4, "ignore_eos": True}
    t = time.perf_counter(); r = httpx.post("http://localhost:8123/v1/chat/completions", json=body, timeout=900).json()
    return round(time.perf_counter() - t, 2), r["usage"]["prompt_tokens_details"]["cached_tokens"]
for rep in range(2):
    system = " ".join(W[(i * 7 + rep * 3) % len(W)] for i in range(1800)) + f" v{rep}"
    print("cold", rep, ask(system, "first question"), flush=True)
    open(f"/tmp/cold{rep}", "w").write("x")
    print("hit", rep, ask(system, "second question"), flush=True)
    open(f"/tmp/hit{rep}", "w").write("x")
PY
CLIENT=$!
while [ ! -f /tmp/cold0 ]; do sleep 0.5; done
touch /tmp/marker-cold0
for s in 3 10 25; do
  sleep $s
  [ -f /tmp/hit0 ] && break
  gdb -p $PID -batch -ex "thread apply all bt 25" > $OUT/bt-$s.txt 2>&1
  top -b -n1 -H -p $PID | head -15 > $OUT/top-$s.txt
done
while [ ! -f /tmp/hit0 ]; do sleep 0.5; done
find / -xdev -newer /tmp/marker-cold0 -type f 2>/dev/null | grep -v "^/proc\|^/sys\|/tmp/hit0" | head -400 > $OUT/new-files-during-hit.txt
wait $CLIENT
kill $PID
