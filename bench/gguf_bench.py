"""The default model as a GGUF file against the same weights in MLX layout
(issue 13): start-up and decode speed, mlx-serve on both, and mlx-lm on the MLX
folder, in one run on one machine.

- cold start: wall time of `mlx-serve generate --max-tokens 1` (process start,
  model and tokenizer load, a 1-token prompt, one token), page cache warm;
  for mlx-lm, `load()` plus the same one-token generation, in process.
- decode: `generate --json` with a prompt of --prompt-tokens and
  --gen-tokens generated (end-of-sequence ignored) after one untimed pass.

usage: python bench/gguf_bench.py --gguf FILE.gguf --mlx DIR --mlx-serve BIN
           [--prompt-tokens 128] [--gen-tokens 64] [--runs 3] [--out results.json]
The MLX folder is what parity/gguf_to_mlx.py writes from the GGUF file.
"""

import argparse
import json
import statistics
import subprocess
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import stream_generate

WORDS = "the model token server memory cache layer weight attention value key query stream".split()


def prompt_text(n_words):
    return " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(n_words))


def cold_start(binary, model):
    t = time.perf_counter()
    subprocess.run([binary, "generate", "--model", model, "--prompt", "hi", "--max-tokens", "1",
                    "--ignore-chat-template", "--json"], check=True, capture_output=True)
    return time.perf_counter() - t


def ours(binary, model, prompt, gen):
    out = subprocess.run([binary, "generate", "--model", model, "--prompt", prompt, "--max-tokens", str(gen),
                          "--ignore-chat-template", "--ignore-eos", "--warmup", "--json"],
                         check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    return r["prompt_tokens"], r["prompt_tps"], r["generation_tps"]


def mlx_lm_cold(model_dir):
    t = time.perf_counter()
    model, tok = load(model_dir)
    for _ in stream_generate(model, tok, tok.encode("hi"), max_tokens=1):
        pass
    return time.perf_counter() - t


def mlx_lm_decode(model_dir, prompt, gen):
    model, tok = load(model_dir)
    ids = tok.encode(prompt)
    last = None
    for _ in range(2):  # the first pass untimed
        for last in stream_generate(model, tok, ids, max_tokens=gen):
            pass
    return len(ids), last.prompt_tps, last.generation_tps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", required=True)
    p.add_argument("--mlx", required=True)
    p.add_argument("--mlx-serve", required=True)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args()
    prompt = prompt_text(a.prompt_tokens)
    rows = {"mlx-serve, GGUF": [], "mlx-serve, MLX folder": [], "mlx-lm, MLX folder": []}
    for _ in range(a.runs):  # interleaved, so machine load falls on all three
        for name, model in (("mlx-serve, GGUF", a.gguf), ("mlx-serve, MLX folder", a.mlx)):
            rows[name].append((cold_start(a.mlx_serve, model),) + ours(a.mlx_serve, model, prompt, a.gen_tokens))
        mx.clear_cache()
        rows["mlx-lm, MLX folder"].append((mlx_lm_cold(a.mlx),) + mlx_lm_decode(a.mlx, prompt, a.gen_tokens))
    med = lambda xs: statistics.median(xs)
    span = lambda xs: f"{min(xs):.2f}–{max(xs):.2f}"
    print(f"| engine, weights | cold start s | prompt tok/s ({a.prompt_tokens} words) | generation tok/s |")
    print("| --- | --- | --- | --- |")
    for name, rs in rows.items():
        cold, _, ptps, gtps = zip(*rs)
        print(f"| {name} | {med(cold):.2f} ({span(cold)}) | {med(ptps):.1f} ({span(ptps)}) | {med(gtps):.1f} ({span(gtps)}) |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
