"""Where gemma3_bf16 (the parity fixture) leaves mlx-lm's tokens on CUDA: the log-probability
of each generated token, mlx-lm's (generate_step, the fixture's 512-token prefill chunks)
against mlx-serve's (its server, --prefill-size 512, legacy `logprobs`), step by step, and
mlx-lm's again with the prompt in one chunk (how much a chunking alone moves them).
usage: python3 gemma3_steps.py FIXTURE_DIR MLX_SERVE_BIN"""
import json, subprocess, sys, time, urllib.request
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.utils import load

fixture, binary = Path(sys.argv[1]), sys.argv[2]
ref = json.loads((fixture / "reference.json").read_text())
prompt, n = ref["prompt"], len(ref["tokens"])


def mlx_lm_steps(chunk):
    model, _ = load(str(fixture))
    out = []
    for token, logprobs in generate_step(mx.array(prompt), model, max_tokens=n, prefill_step_size=chunk):
        out.append((int(token), float(logprobs[int(token)].astype(mx.float32).item()),
                    float(mx.max(logprobs).astype(mx.float32).item())))
    del model
    mx.clear_cache()
    return out


lm = mlx_lm_steps(512)
lm_whole = mlx_lm_steps(4096)

port = 18431
server = subprocess.Popen([binary, "--model", str(fixture), "--port", str(port), "--prefill-size", "512", "--log-level", "warn"])
try:
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except Exception:
            time.sleep(0.5)
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 1, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    choice = json.loads(urllib.request.urlopen(req, timeout=600).read())["choices"][0]
finally:
    server.terminate()
ours = choice["logprobs"]["token_logprobs"]
print("step | mlx-lm token | its logprob | mlx-lm one chunk | mlx-serve logprob of its own token | same token")
first_diff = None
for i, ((t, lp, _), (tw, lpw, _), o) in enumerate(zip(lm, lm_whole, ours)):
    same = t == ref["tokens"][i]
    if first_diff is None and lp != o:
        first_diff = i
    if i < 40:
        print(f"{i} | {t} | {lp:.7f} | {tw} {lpw:.7f} | {o:.7f} | {same}")
print("mlx-lm (512 chunks) equals the fixture's tokens:", [t for t, _, _ in lm] == ref["tokens"])
print("mlx-lm one chunk equals them:", [t for t, _, _ in lm_whole] == ref["tokens"])
print("first step where mlx-serve's logprob differs from mlx-lm's:", first_diff)
