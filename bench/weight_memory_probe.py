"""Does it matter on CUDA where a weight's bytes lie? MLX allocates an array made on the host
(numpy, or our file reader on the CPU stream) in CUDA managed memory and a GPU kernel's output
in device memory (cudaMallocAsync). mlx-serve's resident weights are the former, a streamed
model's expert pools the latter (BENCHMARKS.md, "where a resident model's weights lie on CUDA").
This times MLX's products on both kinds of the same weights, and checks that a copy made on
the GPU lets the host-made buffer go (active memory before and after):

- a Qwen3-30B-A3B-shaped expert stack (128 experts, 4-bit, group 64): gather_qmm over a
  2048-token chunk's sorted picks (8 a token, spread over every expert) and over one token's 8;
- a Llama-3.1-8B gate/up weight (14336 x 4096, 4-bit): quantized_matmul at 1 and 512 rows.

usage: python bench/weight_memory_probe.py [--reps 20] [--chunk 2048] [--rows 512]
(smaller --chunk and --rows for a quick run on a CPU, where every weight is host memory)
"""

import argparse
import gc

import mlx.core as mx
import numpy as np

from prefill_matmul_probe import timed  # median seconds of --reps calls after one untimed


def gib(b):
    return f"{b / 2**30:.3f} GiB"


def host_made(shape, dtype, rng):
    """An array whose buffer MLX allocated without a stream (from numpy)."""
    if dtype == mx.uint32:
        return mx.array(rng.integers(0, 2**32, size=shape, dtype=np.uint32))
    return mx.array(rng.standard_normal(shape).astype(np.float32) * 0.02).astype(dtype)


def device_copy(a):
    """`a` copied by a GPU kernel (a product with 1; `a` is held, so its buffer is not donated)."""
    c = a * mx.array(1, dtype=a.dtype)
    mx.eval(c)
    return c


def quantized_weight(rng, shape, group=64):
    *batch, n, k = shape
    w = host_made((*batch, n, k * 4 // 32), mx.uint32, rng)
    scales = host_made((*batch, n, k // group), mx.bfloat16, rng)
    biases = host_made((*batch, n, k // group), mx.bfloat16, rng)
    mx.eval(w, scales, biases)
    return [w, scales, biases]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=2048, help="prefill chunk tokens for the expert stack")
    ap.add_argument("--rows", type=int, default=512, help="rows of the dense prompt product")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"device {mx.default_device()}, MLX {mx.__version__}")

    experts, top_k, hidden, inter = 128, 8, 2048, 768
    stack = quantized_weight(rng, (experts, inter, hidden))
    dense = quantized_weight(rng, (14336, 4096))
    mx.synchronize()
    before = mx.get_active_memory()
    stack_dev = [device_copy(t) for t in stack]
    dense_dev = [device_copy(t) for t in dense]
    mx.synchronize()
    with_both = mx.get_active_memory()
    copies = with_both - before
    print(f"active: {gib(before)} host-made; {gib(with_both)} with the device copies (+{gib(copies)})")

    chunk = a.chunk
    picks = mx.sort(mx.array(rng.integers(0, experts, size=chunk * top_k).astype(np.uint32)))
    x_chunk = host_made((chunk * top_k, 1, hidden), mx.bfloat16, rng)
    one = mx.array(rng.choice(experts, size=top_k, replace=False).astype(np.uint32))
    x_one = host_made((top_k, 1, hidden), mx.bfloat16, rng)
    rows1 = host_made((1, 4096), mx.bfloat16, rng)
    rows_n = host_made((a.rows, 4096), mx.bfloat16, rng)
    mx.eval(picks, x_chunk, one, x_one, rows1, rows_n)

    def gather(ws, x, idx, is_sorted):
        return lambda: mx.gather_qmm(x, ws[0], ws[1], ws[2], rhs_indices=idx, transpose=True, group_size=64, bits=4,
                                     sorted_indices=is_sorted)

    def matmul(ws, x):
        return lambda: mx.quantized_matmul(x, ws[0], ws[1], ws[2], transpose=True, group_size=64, bits=4)

    cases = [
        (f"experts: gather_qmm, {chunk}-token chunk ({chunk * top_k} sorted picks)", lambda ws: gather(ws, x_chunk, picks, True)),
        ("experts: gather_qmm, one token (8 picks)", lambda ws: gather(ws, x_one, one, False)),
        ("dense 14336 x 4096: quantized_matmul, 1 row", lambda ws: matmul(ws, rows1)),
        (f"dense 14336 x 4096: quantized_matmul, {a.rows} rows", lambda ws: matmul(ws, rows_n)),
    ]
    print("| product | host-made (managed) ms | device copy ms | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for name, make in cases:
        host_ws, dev_ws = (stack, stack_dev) if name.startswith("experts") else (dense, dense_dev)
        # Alternating, twice: the first of each warms the kernel and the pages.
        t_host = min(timed(make(host_ws), a.reps), timed(make(host_ws), a.reps)) * 1e3
        t_dev = min(timed(make(dev_ws), a.reps), timed(make(dev_ws), a.reps)) * 1e3
        print(f"| {name} | {t_host:.3f} | {t_dev:.3f} | {t_host / t_dev:.2f}x |")

    # Do the host-made buffers go once only the copies hold the weights?
    del stack, dense, host_ws
    gc.collect()
    mx.synchronize()
    mx.clear_cache()
    after = mx.get_active_memory()
    print(f"active after letting the host-made weights go: {gib(after)} (about {gib(with_both - copies)} if they went)")


if __name__ == "__main__":
    main()
