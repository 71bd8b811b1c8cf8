"""What a prompt's expert products cost on this device: MLX's gather_qmm over a chunk's routed
rows sorted by expert (what mlx-lm and mlx-serve run) against dequantizing the layer's expert
stack to the activations' type and running gather_mm over the same sorted rows (on CUDA, MLX
runs a sorted one-row gather_mm as one grouped GEMM on the tensor cores). Qwen3-30B-A3B's expert
shapes (128 experts, top 8, hidden 2048, expert width 768), --bits (4) with group 64, bfloat16.
Each time is the median of --reps calls over --layers independent stacks (after one untimed
call), per layer; the dequantized form is checked against gather_qmm's result.

usage: python bench/moe_prefill_probe.py [--tokens 16,128,512,2048] [--bits 4] [--reps 5] [--layers 4]
       (on a CPU, where gather_mm is float32-only: --dtype float32 and small --tokens)
"""

import argparse

import mlx.core as mx

from prefill_matmul_probe import timed  # median seconds of --reps calls after one untimed

EXPERTS, TOP_K, HIDDEN, WIDTH = 128, 8, 2048, 768
# (name, out features, in features) of one expert.
PROJECTIONS = [("gate/up", WIDTH, HIDDEN), ("down", HIDDEN, WIDTH)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="16,128,512,2048")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--bits", type=int, default=4)
    a = ap.parse_args()
    dt = getattr(mx, a.dtype)
    gs, bits = 64, a.bits
    print(f"device {mx.default_device()}, MLX {mx.__version__}, {EXPERTS} experts, top {TOP_K}, {bits}-bit, {a.dtype}")
    print("| projection | tokens (sorted rows) | gather_qmm ms | dequantize + gather_mm ms | of which dequantize ms | speed-up | max rel. diff |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, n, k in PROJECTIONS:
        stacks = []
        for i in range(a.layers):
            w = (mx.random.normal((EXPERTS, n, k), key=mx.random.key(i)) * 0.02).astype(dt)
            stacks.append(mx.quantize(w, group_size=gs, bits=bits))
        mx.eval(stacks)
        for t in [int(s) for s in a.tokens.split(",")]:
            picks = mx.sort(mx.random.randint(0, EXPERTS, (t * TOP_K,), key=mx.random.key(100 + t)).astype(mx.uint32))
            x = (mx.random.normal((t * TOP_K, 1, k), key=mx.random.key(200 + t)) * 0.5).astype(dt)
            mx.eval(picks, x)

            def dense(q):
                return mx.dequantize(*q, group_size=gs, bits=bits, dtype=dt)

            def qmm_of(q):
                return mx.gather_qmm(x, *q, rhs_indices=picks, transpose=True, group_size=gs, bits=bits, sorted_indices=True)

            def deq_mm_of(q):
                return mx.gather_mm(x, mx.swapaxes(dense(q), -1, -2), rhs_indices=picks, sorted_indices=True)

            qmm = lambda: [qmm_of(q) for q in stacks]
            deq_mm = lambda: [deq_mm_of(q) for q in stacks]
            deq = lambda: [dense(q) for q in stacks]

            ref, got = qmm_of(stacks[0]).astype(mx.float32), deq_mm_of(stacks[0]).astype(mx.float32)
            diff = (mx.abs(ref - got).max() / mx.abs(ref).max()).item()
            tq, td, tdq = (timed(f, a.reps) / a.layers for f in (qmm, deq_mm, deq))
            print(f"| {name} {n}x{k} | {t} ({t * TOP_K}) | {tq * 1e3:.3f} | {td * 1e3:.3f} | {tdq * 1e3:.3f} | "
                  f"{tq / td:.2f}x | {diff:.1e} |")
        del stacks
        mx.clear_cache()


if __name__ == "__main__":
    main()
