"""Where a server's prefill time goes when several prompts arrive at once, measured with mlx-lm's
model (the same MLX ops as mlx-serve's): prompts prefilled one model call each (mlx-serve's
engine queues them back to back) against one call over all of them (left-padded to the longest,
as mlx-lm's BatchGenerator does), and what a prompt length not seen before costs (MLX builds
kernels and attention plans per shape on a GPU).

Each prefill evaluates the caches only (the engine samples from the last position later), on a
fresh cache per call. Times are wall-clock medians over --reps, after an untimed first call of
each shape.

With --chunked L1,L2,... (after the above): each prompt length prefilled in --chunk-token chunks into a cache
holding the whole prompt's room from the start (mlx-serve's reserve), twice: the first time
against the second shows what shapes not seen before cost per chunk.

usage: python bench/prefill_probe.py MODEL_DIR [--rows 1,2,4,8] [--lengths 128] [--reps 5]
                                              [--chunked 4096,4000] [--chunk 512]
"""

import argparse, statistics, time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache


class ReservedCache(KVCache):
    """mlx-serve's single-sequence layout: one buffer with the prompt's room rounded up to 256
    positions, chunks written in place, attention over the view of the positions written."""

    def __init__(self, capacity):
        super().__init__()
        self.capacity = (capacity + 255) // 256 * 256

    def update_and_fetch(self, keys, values):
        if self.keys is None:
            b, h, _, d = keys.shape
            self.keys = mx.zeros((b, h, self.capacity, d), keys.dtype)
            self.values = mx.zeros((b, h, self.capacity, values.shape[3]), values.dtype)
        n = keys.shape[2]
        self.keys[..., self.offset:self.offset + n, :] = keys
        self.values[..., self.offset:self.offset + n, :] = values
        self.offset += n
        return self.keys[..., :self.offset, :], self.values[..., :self.offset, :]


def chunked(model, length, chunk):
    """Seconds to prefill a `length`-token prompt in `chunk`-token chunks, each waited for."""
    ids = [1 + (i * 31) % 1000 for i in range(length)]
    cache = [ReservedCache(length) for _ in model.layers]
    t = time.perf_counter()
    for at in range(0, length, chunk):
        model(mx.array([ids[at:at + chunk]]), cache=cache)
        mx.eval(states(cache))
    return time.perf_counter() - t


def prompt_ids(rows, length, seed):
    return [[1 + (seed * 7919 + r * 104729 + i * 31) % 1000 for i in range(length - r % 3)] for r in range(rows)]


def states(cache):
    return [a for c in cache for a in (c.keys, c.values) if a is not None]


def one_call_each(model, prompts):
    """Every prompt its own model call, each queued before the first is waited for."""
    kept = []
    for p in prompts:
        cache = make_prompt_cache(model)
        model(mx.array([p]), cache=cache)
        mx.async_eval(states(cache))
        kept.append(cache)
    mx.eval([a for c in kept for a in states(c)])


def one_call(model, prompts):
    """One model call over every prompt, left-padded to the longest."""
    longest = max(len(p) for p in prompts)
    pads = [longest - len(p) for p in prompts]
    cache = [BatchKVCache(pads) for _ in model.layers]
    ids = mx.array([[0] * pad + p for pad, p in zip(pads, prompts)])
    model(ids, cache=cache)
    mx.eval(states(cache))


def timed(fn, model, prompts, reps):
    fn(model, prompts)  # shapes seen once, untimed
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(model, prompts)
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--lengths", default="128")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--new-shapes", type=int, default=4, help="first calls of unseen lengths to time")
    ap.add_argument("--chunked", default="", help="prompt lengths to prefill in chunks, twice each")
    ap.add_argument("--chunk", type=int, default=512)
    a = ap.parse_args()
    model, _ = load(a.model)
    print(f"device {mx.default_device()}, model {a.model}")
    # Unseen lengths: the first call against the second of the same shape.
    base = int(a.lengths.split(",")[0])
    for k in range(a.new_shapes):
        p = [[1 + (i * 31) % 1000 for i in range(base - 5 - k)]]
        t = time.perf_counter(); one_call_each(model, p); first = time.perf_counter() - t
        t = time.perf_counter(); one_call_each(model, p); second = time.perf_counter() - t
        print(f"| new length {len(p[0])} | first call {first * 1e3:.1f} ms | second {second * 1e3:.1f} ms |")
    print("| rows x tokens | one call each (ms) | one padded call (ms) | ratio | prompt tok/s, each / padded |")
    print("|---|---:|---:|---:|---|")
    for length in [int(x) for x in a.lengths.split(",")]:
        for rows in [int(x) for x in a.rows.split(",")]:
            prompts = prompt_ids(rows, length, rows)
            tokens = sum(len(p) for p in prompts)
            each = timed(one_call_each, model, prompts, a.reps)
            padded = timed(one_call, model, prompts, a.reps)
            print(f"| {rows} x ~{length} | {each:.1f} | {padded:.1f} | {each / padded:.2f}x | "
                  f"{tokens / each * 1e3:.0f} / {tokens / padded * 1e3:.0f} |")
    if a.chunked:
        print(f"| prompt tokens ({a.chunk}-token chunks) | first prefill (ms) | second (ms) | first - second per chunk (ms) |")
        print("|---|---:|---:|---:|")
        for length in [int(x) for x in a.chunked.split(",")]:
            first, second = chunked(model, length, a.chunk), chunked(model, length, a.chunk)
            chunks = (length + a.chunk - 1) // a.chunk
            print(f"| {length} | {first * 1e3:.1f} | {second * 1e3:.1f} | {(first - second) / chunks * 1e3:.1f} |")


if __name__ == "__main__":
    main()
