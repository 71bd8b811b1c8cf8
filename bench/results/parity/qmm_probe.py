# Which quantized matmuls MLX's CUDA backend runs at attention's shapes (--kv-bits): q·kᵀ (transposed) and scores·V.
import mlx.core as mx
for bits in (8, 4):
    for m in (1, 4, 511):
        for s in (1023, 1024):
            k = mx.random.normal((1, 8, 1, s, 128)).astype(mx.bfloat16)
            kq = mx.quantize(k, group_size=64, bits=bits)
            q = mx.random.normal((1, 8, 4, m, 128)).astype(mx.bfloat16)
            p = mx.random.normal((1, 8, 4, m, s)).astype(mx.bfloat16)
            for name, f in (("q.kT", lambda: mx.quantized_matmul(q, *kq, transpose=True, group_size=64, bits=bits)),
                            ("p.V ", lambda: mx.quantized_matmul(p, *kq, transpose=False, group_size=64, bits=bits))):
                try:
                    mx.eval(f()); r = "ok"
                except Exception as e:
                    r = "FAILS " + str(e)[:90]
                print(f"bits {bits} m {m:3d} keys {s}: {name} {r}", flush=True)
