"""KV-cache formats simulated in mlx-lm, to sweep choices the server fixes
(how many recent tokens stay unquantized) in one run.

Each format's cache quantizes and dequantizes ("fake quantization") every
position older than its recent window when decoding starts and as positions
leave the window; the first 4 tokens stay exact as in the server. Teacher-
forced on a text: the first --prefix tokens prefilled exact, the rest scored
one decode step at a time; prints each format's mean/max KL divergence of
next-token distributions against the exact cache, perplexity and top-1
agreement, one JSON line each.

Formats: kv8 / kv4 (mlx-lm's affine cache: groups of 64, no rotation, no
exact tokens) or "k:<a8|c4|c3|none>,v:<bits|a8|none>,w:<window>" — keys
8-bit affine or a 4/3-bit Lloyd-Max codebook after a random rotation, values
a codebook of that many bits, w positions kept exact (TurboQuant's
`balanced` at head dim 64 is k:a8,v:4).

  vendor/pyref/bin/python bench/kv_window_sim.py --model /tmp/smollm2-fp32 \
      --text /usr/share/common-licenses/GPL-3 --tokens 1280 --prefix 1024 \
      kv8 k:a8,v:4 k:a8,v:4,w:32 k:a8,v:4,w:128

The rotation here is a random orthogonal matrix, the server's a randomized
Hadamard transform; both spread a vector's energy evenly, which is what the
codebooks assume. The model is cast to float32 (as kv-quality's runs)."""
import argparse, json, math, time
import numpy as np
import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm import load
from mlx_lm.models.cache import KVCache

SINKS = 4
HALF = {2: [0.452780, 1.510418], 3: [0.245094, 0.756005, 1.343909, 2.151946],
        4: [0.128395, 0.388048, 0.656759, 0.942340, 1.256231, 1.618046, 2.069017, 2.73259]}

def book(bits, d):
    h = np.array(HALF[bits], np.float32) / math.sqrt(d)
    return mx.array(np.concatenate([-h[::-1], h]))

def fq_affine(x, bits, gs):
    w, s, b = mx.quantize(x, group_size=gs, bits=bits)
    return mx.dequantize(w, s, b, group_size=gs, bits=bits).astype(x.dtype)

def fq_book(x, bits):
    d = x.shape[-1]
    c = book(bits, d)
    n = mx.sqrt((x * x).sum(-1, keepdims=True))
    u = x / mx.maximum(n, 1e-20)
    idx = mx.argmin(mx.abs(u[..., None] - c), axis=-1)
    dec = c[idx]
    dn = mx.sqrt((dec * dec).sum(-1, keepdims=True))
    return (dec * n / mx.maximum(dn, 1e-20)).astype(x.dtype)

class Fmt:
    def __init__(self, spec, d, seed=7):
        # spec: kv8 | kv4 | k:<a8|c4|c3|none>,v:<bits|a8|none>,w:<window>,rot:<0|1>
        self.window = 0
        if spec in ("kv8", "kv4"):
            b = int(spec[2]); self.k = ("a", b); self.v = ("a", b); self.rot = False; self.sinks = 0
        else:
            kv = dict(p.split(":") for p in spec.split(","))
            self.k = {"a8": ("a", 8), "c4": ("c", 4), "c3": ("c", 3), "none": None}[kv.get("k", "a8")]
            vb = kv.get("v", "4")
            self.v = None if vb == "none" else (("a", 8) if vb == "a8" else ("c", int(vb)))
            self.window = int(kv.get("w", 0)); self.rot = kv.get("rot", "1") == "1"; self.sinks = SINKS
        rng = np.random.default_rng(seed)
        q, _ = np.linalg.qr(rng.standard_normal((d, d)))
        self.R = mx.array(q.astype(np.float32))
        self.gs = min(d, 128) if self.rot else 64

    def one(self, x, code):
        if code is None:
            return x
        if self.rot:
            x = x @ self.R.T
        x = fq_affine(x, code[1], self.gs) if code[0] == "a" else fq_book(x, code[1])
        return x @ self.R if self.rot else x

class SimCache(KVCache):
    def __init__(self, fmt):
        super().__init__(); self.fmt = fmt; self.active = False; self.done = None
    def update_and_fetch(self, k, v):
        super().update_and_fetch(k, v)
        if self.active:
            f = self.fmt
            if self.done is None:
                self.done = f.sinks
            end = self.offset - f.window
            if end > self.done:
                a, b = self.done, end
                self.keys[..., a:b, :] = f.one(self.keys[..., a:b, :], f.k)
                self.values[..., a:b, :] = f.one(self.values[..., a:b, :], f.v)
                self.done = end
        return self.keys[..., :self.offset, :], self.values[..., :self.offset, :]

def run(model, toks, prefix, spec, d):
    cache = [SimCache(Fmt(spec, d, seed=7 + i)) for i, _ in enumerate(model.layers)] if spec else [KVCache() for _ in model.layers]
    x = mx.array(toks[:prefix])[None]
    for s in range(0, prefix, 512):
        model(x[:, s:s + 512], cache=cache); mx.eval([c.keys for c in cache])
    for c in cache:
        if spec: c.active = True
    out = []
    for t in range(prefix, len(toks)):
        logits = model(mx.array([[toks[t - 1]]]), cache=cache)[0, -1]
        lp = logits.astype(mx.float32) - mx.logsumexp(logits.astype(mx.float32))
        mx.eval(lp); out.append(lp)
    return mx.stack(out)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model"); ap.add_argument("--text"); ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--prefix", type=int, default=1536); ap.add_argument("formats", nargs="+")
    a = ap.parse_args()
    model, tok = load(a.model)
    model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
    toks = tok.encode(open(a.text).read())[: a.tokens]
    d = model.args.head_dim if getattr(model.args, "head_dim", None) else model.args.hidden_size // model.args.num_attention_heads
    ref = run(model, toks, a.prefix, None, d)
    target = mx.array(toks[a.prefix:])
    ppl0 = math.exp(-float(mx.take_along_axis(ref, target[:, None], 1).mean()))
    print(json.dumps({"format": "exact", "ppl": round(ppl0, 3)}), flush=True)
    for spec in a.formats:
        t0 = time.time()
        lp = run(model, toks, a.prefix, spec, d)
        kl = (mx.exp(ref) * (ref - lp)).sum(-1)
        ppl = math.exp(-float(mx.take_along_axis(lp, target[:, None], 1).mean()))
        top1 = float((mx.argmax(lp, -1) == mx.argmax(ref, -1)).astype(mx.float32).mean())
        print(json.dumps({"format": spec, "mean_kl": round(float(kl.mean()), 6), "max_kl": round(float(kl.max()), 4),
                          "ppl": round(ppl, 3), "dppl_pct": round(100 * (ppl / ppl0 - 1), 2), "top1": round(top1, 4),
                          "s": round(time.time() - t0, 1)}), flush=True)

main()
