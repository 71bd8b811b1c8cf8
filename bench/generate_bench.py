"""mlx-serve generate vs mlx_lm.generate on one model, same machine, one run.

Both get the same prompt text (no chat template) and generate exactly
--gen-tokens tokens (end-of-sequence ignored, greedy), each after the same
generation ran once untimed in the same process (GPU kernels compile on first
use of each shape). Prints a Markdown table, where the two engines' greedy
tokens first differ (and, there, how far mlx-lm's logits put its token ahead of
ours), and writes the raw numbers and tokens as JSON.

usage: python bench/generate_bench.py --model DIR --mlx-serve target/release/mlx-serve
           [--prompt-tokens 512] [--gen-tokens 128] [--runs 3] [--out results.json]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import stream_generate

WORDS = "the model token server memory cache layer weight attention value key query stream".split()


def prompt_text(tokenizer, n_tokens):
    """The fewest words of the WORDS cycle whose text encodes to at least n_tokens tokens.
    Found by doubling the word count, then bisecting: encoding the text again after each
    word was quadratic (a 16K-token prompt outlasted a 200 s limit)."""
    text = lambda k: " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(k))
    short = lambda k: len(tokenizer.encode(text(k))) < n_tokens
    if not short(0):
        return ""
    lo, hi = 0, 1  # short(lo) holds throughout; short(hi) fails once hi is large enough
    while short(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if short(mid):
            lo = mid
        else:
            hi = mid
    return text(hi)


def run_ours(binary, model, prompt, gen_tokens, prefill):
    out = subprocess.run(
        [binary, "generate", "--model", model, "--prompt", prompt, "--max-tokens", str(gen_tokens),
         "--ignore-chat-template", "--ignore-eos", "--warmup", "--prefill-size", str(prefill), "--json"],
        check=True, capture_output=True, text=True,
    )
    r = json.loads(out.stdout)
    return {"prompt_tokens": r["prompt_tokens"], "prompt_tps": r["prompt_tps"],
            "generation_tps": r["generation_tps"], "ttft_ms": r["ttft_ms"],
            "peak_memory_gb": r["peak_memory_bytes"] / 1e9, "tokens": len(r["generated_token_ids"]),
            "ids": r["generated_token_ids"]}


def run_mlx_lm(model, tokenizer, prompt, gen_tokens, prefill):
    tokenizer.eos_token_ids = set()  # fixed length, as --ignore-eos
    kw = dict(prefill_step_size=prefill)
    for _ in stream_generate(model, tokenizer, prompt, max_tokens=gen_tokens, **kw):
        pass
    mx.reset_peak_memory()
    tic = time.perf_counter()
    ttft, last, ids = None, None, []
    for r in stream_generate(model, tokenizer, prompt, max_tokens=gen_tokens, **kw):
        if ttft is None:
            ttft = time.perf_counter() - tic
        last = r
        ids.append(int(r.token))
    return {"prompt_tokens": last.prompt_tokens, "prompt_tps": last.prompt_tps,
            "generation_tps": last.generation_tps, "ttft_ms": ttft * 1e3,
            "peak_memory_gb": mx.get_peak_memory() / 1e9, "tokens": last.generation_tokens, "ids": ids}


def margin_at(model, tokenizer, prompt, ref_ids, first, ours_token):
    """mlx-lm's logits for the token after prompt + its first `first` tokens (one forward pass
    over the whole sequence): how far its own token leads ours there, and our token's rank.
    A lead within the 16-bit rounding of the last layers is a near-tie that either engine's
    rounding may break either way; a large one is a real difference."""
    seq = mx.array(tokenizer.encode(prompt) + ref_ids[:first])[None]
    logits = model(seq)[0, -1].astype(mx.float32)
    lead = (logits[ref_ids[first]] - logits[ours_token]).item()
    rank = int((logits > logits[ours_token]).sum().item())
    spread = mx.std(logits).item()
    return {"lead": lead, "our_rank": rank, "logit_std": spread}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-serve", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--prefill-size", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()

    model, tokenizer = load(a.model)
    prompt = prompt_text(tokenizer, a.prompt_tokens)
    ours, ref = [], []
    for _ in range(a.runs):  # alternate, so drift hits both alike
        ours.append(run_ours(a.mlx_serve, a.model, prompt, a.gen_tokens, a.prefill_size))
        print(f"mlx-serve run: { {k: v for k, v in ours[-1].items() if k != 'ids'} }", file=sys.stderr, flush=True)
        ref.append(run_mlx_lm(model, tokenizer, prompt, a.gen_tokens, a.prefill_size))
        print(f"mlx-lm run: { {k: v for k, v in ref[-1].items() if k != 'ids'} }", file=sys.stderr, flush=True)

    med = lambda rs, k: statistics.median(r[k] for r in rs)
    rows = [("prompt tok/s", "prompt_tps", "{:.1f}"), ("generation tok/s", "generation_tps", "{:.1f}"),
            ("TTFT ms", "ttft_ms", "{:.1f}"), ("peak memory GB", "peak_memory_gb", "{:.3f}")]
    print(f"model {a.model}: prompt {ours[0]['prompt_tokens']} tokens, {a.gen_tokens} generated, "
          f"median of {a.runs} runs, device {mx.default_device()}")
    print("| metric | mlx-serve | mlx-lm 0.32.2 | ratio |")
    print("| --- | --- | --- | --- |")
    for name, k, f in rows:
        o, r = med(ours, k), med(ref, k)
        print(f"| {name} | {f.format(o)} | {f.format(r)} | {o / r:.2f} |")
    a_ids, b_ids = ours[0]["ids"], ref[0]["ids"]
    first = next((i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y), None)
    print(f"greedy tokens (first run): {'the same' if first is None and len(a_ids) == len(b_ids) else f'first differ at token {first}'}"
          f" ({len(a_ids)} and {len(b_ids)} generated)")
    if first is not None:
        m = margin_at(model, tokenizer, prompt, b_ids, first, a_ids[first])
        ours[0]["divergence"] = m
        print(f"at token {first} mlx-lm's logits put its token {b_ids[first]} ahead of ours {a_ids[first]} by "
              f"{m['lead']:.4f} (ours ranks {m['our_rank']}; the logits' std {m['logit_std']:.3f})")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"model": a.model, "ours": ours, "mlx_lm": ref, "args": vars(a)}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
