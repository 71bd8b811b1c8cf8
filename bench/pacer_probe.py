"""How many dequantized weights a chain of prompt products keeps on the device, paced as
server/src/models/prompt_matmul.rs's Pacer paces them (a checkpoint every half limit: start the
product at hand, wait for the checkpoint before it), against unpaced and against waiting at
every product: MLX's peak memory above the start, in dense weights. The chain is
server/tests/prompt_matmul.rs's (layers of 4-bit weights, group 64, bfloat16 activations), at
that test's size and larger; "+sync" also drains the stream at each wait (what a backend that
frees a command's buffers after its completion, as MLX's CUDA backend does on a worker thread,
needs for the wait to free them).

usage: python bench/pacer_probe.py [--sizes 512x256,2048x512,4096x1024] [--layers 24] [--limit 4]
"""

import argparse

import mlx.core as mx


def chain(x, weights, product):
    h = x
    for w in weights:
        h = product(h, w)
    return h


def dequantized(h, w):
    q, s, b = w
    return h @ mx.dequantize(q, s, b, group_size=64, bits=4, dtype=h.dtype).T


def paced(limit, dense, sync):
    state = {"queued": 0, "checkpoint": None}

    def product(h, w):
        y = dequantized(h, w)
        state["queued"] += dense
        if state["queued"] * 2 >= limit:
            state["queued"] = 0
            before = state["checkpoint"]
            marker = y[(slice(0, 1),) * y.ndim].astype(mx.float32)
            mx.async_eval(marker)
            if before is not None:
                mx.eval(before)
                if sync:
                    mx.synchronize()
            state["checkpoint"] = marker
        return y

    return product


def peak_above_start(run):
    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    start = mx.get_active_memory()
    out = run()
    mx.eval(out)
    mx.synchronize()
    return mx.get_peak_memory() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512x256,2048x512,4096x1024", help="width x rows")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--limit", type=int, default=4, help="the pacing bound, in dense weights")
    a = ap.parse_args()
    print(f"device {mx.default_device()}, {a.layers} layers, bound {a.limit} dense weights")
    print("| width x rows | dense weight MB | unpaced | every product | paced | paced +sync | (dense weights above the start) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for size in a.sizes.split(","):
        width, rows = (int(v) for v in size.split("x"))
        mx.random.seed(0)
        weights = []
        for _ in range(a.layers):
            weights.append(mx.quantize(mx.random.normal((width, width)).astype(mx.bfloat16) * 0.02, group_size=64, bits=4))
        mx.eval(weights)
        x = (mx.random.normal((1, rows, width)) * 0.05).astype(mx.bfloat16)
        mx.eval(x)
        dense = width * width * 2
        runs = {
            "unpaced": lambda: chain(x, weights, dequantized),
            "every": lambda: chain(x, weights, paced(dense, dense, False)),
            "paced": lambda: chain(x, weights, paced(a.limit * dense, dense, False)),
            "paced+sync": lambda: chain(x, weights, paced(a.limit * dense, dense, True)),
        }
        for run in runs.values():  # compiles each kernel outside the measured runs
            mx.eval(run())
        got = {name: peak_above_start(run) / dense for name, run in runs.items()}
        print(f"| {width} x {rows} | {dense / 1e6:.1f} | {got['unpaced']:.1f} | {got['every']:.1f} | {got['paced']:.1f} | {got['paced+sync']:.1f} | |")


if __name__ == "__main__":
    main()
