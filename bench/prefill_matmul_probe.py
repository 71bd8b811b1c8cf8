"""What a prompt's quantized matmuls cost on this device, MLX's quantized_matmul against
dequantizing the weight first and multiplying in its float type (what a GPU's matrix units are
for): the Llama-3.1-8B weight shapes at prefill sizes. Each time is the median over --reps of
--layers independent weights (so the timing spans more than one kernel's launch), after an
untimed call of the shape.

usage: python bench/prefill_matmul_probe.py [--rows 1,16,32,64,143,512,1144,2048] [--bits 4]
                                          [--group-size 64] [--reps 5] [--layers 8]
"""

import argparse, statistics, time

import mlx.core as mx

# (name, N, K): out features, in features, Llama-3.1-8B.
SHAPES = [("q/o proj", 4096, 4096), ("k/v proj", 1024, 4096), ("gate/up", 14336, 4096), ("down", 4096, 14336)]


def timed(fn, reps):
    mx.eval(fn())
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(fn())
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,16,32,64,143,512,1144,2048")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    print(f"device {mx.default_device()}, {a.bits}-bit, group {a.group_size}, bfloat16 activations")
    print("| weight | rows | quantized_matmul (ms) | dequantize + matmul (ms) | of which matmul (ms) | TFLOP/s, qmm / deq+mm | speed-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, n, k in SHAPES:
        ws = []
        for i in range(a.layers):
            w = mx.random.normal((n, k), key=mx.random.key(i)).astype(mx.bfloat16) * 0.02
            ws.append(mx.quantize(w, group_size=a.group_size, bits=a.bits))
        dense = [mx.dequantize(*q, group_size=a.group_size, bits=a.bits) for q in ws]
        mx.eval(ws, dense)
        for m in [int(r) for r in a.rows.split(",")]:
            x = (mx.random.normal((m, k)) * 0.5).astype(mx.bfloat16)
            mx.eval(x)
            qmm = lambda: [mx.quantized_matmul(x, *q, transpose=True, group_size=a.group_size, bits=a.bits) for q in ws]
            deq = lambda: [x @ mx.dequantize(*q, group_size=a.group_size, bits=a.bits).T for q in ws]
            mm = lambda: [x @ d.T for d in dense]
            tq, td, tm = (timed(f, a.reps) / a.layers for f in (qmm, deq, mm))
            flop = 2 * m * n * k
            print(f"| {name} {n}x{k} | {m} | {tq * 1e3:.3f} | {td * 1e3:.3f} | {tm * 1e3:.3f} | "
                  f"{flop / tq / 1e12:.0f} / {flop / td / 1e12:.0f} | {tq / td:.2f}x |")
        del ws, dense
        mx.clear_cache()


if __name__ == "__main__":
    main()
