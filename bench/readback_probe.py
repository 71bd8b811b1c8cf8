"""Does the way the host reads each sampled token back cost decode speed?

mlx-lm's decode loop (generate_step) queues step n+1 with async_eval, then reads
token n with `y.item()`, which only waits for token n's own event: the device
keeps working on step n+1 while the host builds step n+2. mlx-serve at c07ade9
reads the token through `Array::item` -> `Array::to_vec`, which first applies
`contiguous` (a new op, queued on the stream behind step n+1) and evaluates it,
so the host waits for step n+1 to finish before it builds step n+2.

This runs mlx-lm's own model and the same greedy pipelined loop as generate_step,
once per read-back variant, alternating, and prints generation tok/s (tokens over
the time since the first token, as mlx-lm counts it):
  item        y.item()                                 (mlx-lm)
  contiguous  mx.eval(mx.contiguous(y)); .item()       (mlx-serve at c07ade9)

usage: python bench/readback_probe.py --model DIR [--prompt-tokens 512] [--gen-tokens 128] [--runs 5]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_bench import prompt_text  # noqa: E402


def read_item(y):
    return y.item()


def read_contiguous(y):
    c = mx.contiguous(y)
    mx.eval(c)
    return c.item()


VARIANTS = {"item": read_item, "contiguous": read_contiguous}


def decode(model, prompt, n, prefill, read):
    cache = make_prompt_cache(model)
    p = mx.array(prompt)
    while p.size > 1:
        k = min(prefill, p.size - 1)
        model(p[:k][None], cache=cache)
        mx.eval([c.state for c in cache])
        p = p[k:]

    def step(tok):
        logits = model(tok[None], cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        return mx.argmax(logprobs, axis=-1), logprobs.squeeze(0)

    y, lp = step(p)
    mx.async_eval(y, lp)
    tic, ids = None, []
    for i in range(n):
        if i + 1 < n:
            ny, nlp = step(y)
            mx.async_eval(ny, nlp)
        ids.append(read(y))
        if tic is None:
            tic = time.perf_counter()
        if i + 1 < n:
            y, lp = ny, nlp
    return n / (time.perf_counter() - tic), ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--prefill-size", type=int, default=512)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    model, tok = load(a.model)
    prompt = tok.encode(prompt_text(tok, a.prompt_tokens))
    ref = None
    for name, read in VARIANTS.items():  # warm-up; the read-back changes no shape or op
        _, ids = decode(model, prompt, a.gen_tokens, a.prefill_size, read)
        if ref is not None:
            same = next((i for i, (x, y) in enumerate(zip(ids, ref)) if x != y), len(ids))
            print(f"{name}: first {same} of {len(ids)} tokens as item's (greedy argmax over "
                  f"random-weight logits can flip between runs on GPU; speed does not depend on it)")
        ref = ids
    tps = {name: [] for name in VARIANTS}
    for _ in range(a.runs):
        for name, read in VARIANTS.items():
            tps[name].append(decode(model, prompt, a.gen_tokens, a.prefill_size, read)[0])
    print(f"model {a.model}: prompt {len(prompt)} tokens, {a.gen_tokens} generated, {a.runs} runs, "
          f"device {mx.default_device()}")
    print("| token read-back | generation tok/s (median) | runs |")
    print("| --- | --- | --- |")
    for name, v in tps.items():
        print(f"| {name} | {statistics.median(v):.1f} | {', '.join(f'{x:.1f}' for x in v)} |")


if __name__ == "__main__":
    sys.exit(main())
