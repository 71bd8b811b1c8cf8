#!/bin/bash
# Old/new binaries alternating: the 300-token prompt of the test's model, streamed at a budget, prefill-size 128.
for round in 1 2 3; do for v in old new; do for budget in 10% 50%; do
  /work/main/target/release/mlx-serve-$v --model target/tmp/parity/qwen3_moe64_fp32_large --stream-experts --expert-cache-bytes $budget --prompt-cache-bytes 0 --prefill-size 128 --port 8130 > /tmp/ab-$v.log 2>&1 &
  pid=$!; for i in $(seq 100); do curl -s localhost:8130/health > /dev/null && break; sleep 0.2; done
  t0=$(date +%s.%N); out=$(curl -s localhost:8130/v1/completions -H 'Content-Type: application/json' -d @/tmp/req.json)
  t1=$(date +%s.%N); echo "  request s: $(echo "$t1 - $t0" | bc)"; h=$(curl -s localhost:8130/health)
  python3 -c "
import json,sys
o=json.loads(sys.argv[1]); h=json.loads(sys.argv[2])
t=o.get('timings') or {}
print('', '$v', '$budget', 'peak_MB', h['memory']['peak_bytes']//1000000, 'bytes_read_MB', h['experts']['bytes_read']//1000000, 'text', repr(o['choices'][0]['text'][:20]), 'usage', o['usage']['completion_tokens'])
" "$out" "$h"
  grep -o "prompt [0-9.]* tok/s\|prefill[^,]*tok/s" /tmp/ab-$v.log | tail -1
  kill $pid; wait $pid 2>/dev/null
done; done; done
