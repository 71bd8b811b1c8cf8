#!/usr/bin/env bash
# usage (project root, after ./build.sh and scripts/reference-env.sh): bash bench/blas_ab.sh
# env: OPENBLAS (a folder holding openblas-pthread/libopenblas.so.0 and libgfortran.so.5: Debian's
#      libopenblas0-pthread and libgfortran5, `apt-get download` + `dpkg-deb -x`), MODEL (an HF
#      folder mlx-lm loads, e.g. ../shared/tools/real-model.sh's SmolLM2), GGUF (a GGUF file).
# Prefill/decode on this CPU with the mlx-cpu wheel's bundled reference BLAS and with Debian's
# OpenBLAS preloaded, mlx-serve and mlx-lm (same wheel) side by side, one run each, alternating.
O=${OPENBLAS:?OPENBLAS: a folder with openblas-pthread/libopenblas.so.0}
P=$(mktemp)
python3 -c "print(' '.join(['the quick brown fox jumps over the lazy dog'] * 28))" > $P
echo "blas engine model prompt_tokens prefill_tok/s decode_tok/s first_tokens"
for blas in reference openblas; do
  if [ $blas = openblas ]; then E="env LD_LIBRARY_PATH=$O LD_PRELOAD=$O/openblas-pthread/libopenblas.so.0"; else E=env; fi
  for m in ${MODEL:?} ${GGUF:?}; do
    $E target/release/mlx-serve generate --model $m --prompt - --max-tokens 16 --ignore-chat-template --ignore-eos --json < $P 2>/dev/null | tail -1 | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print('$blas mlx-serve', '$(basename $m)', r['prompt_tokens'], round(r['prompt_tps'],1), round(r['generation_tps'],2), r['generated_token_ids'][:8])"
  done
  MODEL=$MODEL P=$P $E vendor/pyref/bin/python - <<'PY'
import os, time, mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
model, tok = load(os.environ["MODEL"])
ids = mx.array(tok.encode(open(os.environ["P"]).read().strip(), add_special_tokens=False))
t0 = time.perf_counter(); out = []; t1 = None
for tokn, _ in generate_step(ids, model, max_tokens=16):
    if t1 is None: t1 = time.perf_counter()
    out.append(int(tokn))
t2 = time.perf_counter()
print("openblas" if os.environ.get("LD_PRELOAD") else "reference", "mlx-lm", os.path.basename(os.environ["MODEL"]), ids.size, round(ids.size / (t1 - t0), 1), round(15 / (t2 - t1), 2), out[:8])
PY
done
