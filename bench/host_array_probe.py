#!/usr/bin/env python3
"""What an expert read costs after the disk, on MLX's GPU backend.

The expert readers turn each slab they read into an MLX array made from host
bytes (`mlx_array_new_data`). On CUDA such arrays live in managed memory, and
the GPU pulls their pages across when a kernel first reads them. This probe
measures, with MLX alone (no disk, no server), a prefill layer's worth of such
arrays (`--experts` experts of `--expert-mb` MB in `--parts` slabs each):

  create   the arrays made from host bytes by `--threads` threads at once
  gather   one GPU concatenation of them (what staging a prefill step does):
           host-made arrays, the same arrays a second time, device-made arrays
  prefetched  creation followed by cudaMemPrefetchAsync of each array to the GPU
           (through the CUDA runtime the process loaded), then the gather
  busy     array creation while the GPU runs a long matmul loop: does it wait?

and prints each as seconds and GB/s. Run after `source .device/cuda-env.sh`.
"""
import argparse
import ctypes
import glob
import os
import threading
import time

import mlx.core as mx
import numpy as np


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def cuda_prefetcher():
    """cudaMemPrefetchAsync to device 0 on the calling thread's stream, then a
    wait on that stream; None where no CUDA runtime is loaded."""
    candidates = glob.glob(os.path.join(os.path.dirname(os.path.dirname(mx.__file__)), "**", "libcudart.so*"), recursive=True)
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        candidates += glob.glob(os.path.join(d, "libcudart.so*"))
    for path in candidates:
        try:
            rt = ctypes.CDLL(path)
        except OSError:
            continue
        version = ctypes.c_int()
        rt.cudaRuntimeGetVersion(ctypes.byref(version))
        per_thread = ctypes.c_void_p(2)  # cudaStreamPerThread
        if version.value >= 13000:
            fn = rt.cudaMemPrefetchAsync
        elif hasattr(rt, "cudaMemPrefetchAsync_v2"):
            fn = rt.cudaMemPrefetchAsync_v2
        else:
            continue
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, MemLocation, ctypes.c_uint, ctypes.c_void_p]

        def prefetch(arr):
            view = np.asarray(arr)
            err = fn(ctypes.c_void_p(view.ctypes.data), view.nbytes, MemLocation(1, 0), 0, per_thread)
            if err:
                raise RuntimeError(f"cudaMemPrefetchAsync: error {err}")

        def wait():
            err = rt.cudaStreamSynchronize(per_thread)
            if err:
                raise RuntimeError(f"cudaStreamSynchronize: error {err}")

        print(f"prefetch through {path} (runtime {version.value})")
        return prefetch, wait
    return None


def timed(f):
    start = time.perf_counter()
    out = f()
    return time.perf_counter() - start, out


def make_host_arrays(slabs, threads, prefetcher=None):
    out = [None] * len(slabs)

    def work(i0):
        for i in range(i0, len(slabs), threads):
            out[i] = mx.array(slabs[i])
            if prefetcher:
                prefetcher[0](out[i])
        if prefetcher:
            prefetcher[1]()

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--experts", type=int, default=96)
    p.add_argument("--expert-mb", type=float, default=2.65)
    p.add_argument("--parts", type=int, default=9)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--busy-dim", type=int, default=8192)
    a = p.parse_args()
    if mx.is_available(mx.gpu):
        mx.set_default_device(mx.gpu)
    words = int(a.expert_mb * 2**20 / a.parts / 4)
    rng = np.random.default_rng(0)
    slabs = [rng.integers(0, 2**32, size=words, dtype=np.uint32) for _ in range(a.experts * a.parts)]
    total = sum(s.nbytes for s in slabs)
    gb = total / 1e9
    print(f"{len(slabs)} slabs, {gb:.3f} GB a round, {a.threads} threads")

    # Warm-up: kernels compiled, the buffer cache holding this size.
    for _ in range(2):
        arrs = make_host_arrays(slabs, a.threads)
        mx.eval(mx.concatenate(arrs))
        del arrs

    for r in range(a.rounds):
        t_create, arrs = timed(lambda: make_host_arrays(slabs, a.threads))
        t_first, joined = timed(lambda: mx.eval(cat := mx.concatenate(arrs)) or cat)
        t_again, _ = timed(lambda: mx.eval(mx.concatenate(arrs)))
        dev = [x + 0 for x in arrs]
        mx.eval(dev)
        t_dev, _ = timed(lambda: mx.eval(mx.concatenate(dev)))
        print(
            f"round {r}: create {t_create*1e3:7.1f} ms ({gb/t_create:6.2f} GB/s)  "
            f"gather host-made {t_first*1e3:7.1f} ms ({gb/t_first:6.2f} GB/s)  "
            f"again {t_again*1e3:6.1f} ms ({gb/t_again:6.1f} GB/s)  "
            f"device-made {t_dev*1e3:6.1f} ms ({gb/t_dev:6.1f} GB/s)"
        )
        del arrs, dev, joined

    prefetcher = cuda_prefetcher() if mx.is_available(mx.gpu) else None
    for r in range(a.rounds if prefetcher else 0):
        t_create, arrs = timed(lambda: make_host_arrays(slabs, a.threads, prefetcher))
        t_first, _ = timed(lambda: mx.eval(mx.concatenate(arrs)))
        print(f"prefetched {r}: create+prefetch {t_create*1e3:7.1f} ms ({gb/t_create:6.2f} GB/s)  gather {t_first*1e3:7.1f} ms ({gb/t_first:6.2f} GB/s)")
        del arrs

    # Creation while the GPU is busy (a matmul loop of about two seconds).
    m = mx.random.normal((a.busy_dim, a.busy_dim)).astype(mx.bfloat16)
    mx.eval(m)
    mx.eval(m @ m)  # compiled before it is timed
    t_mm, _ = timed(lambda: mx.eval(m @ m))
    reps = max(1, int(2.0 / max(t_mm, 1e-4)))
    busy = m
    for _ in range(reps):
        busy = busy @ m
    done = {}

    def create():
        time.sleep(0.05)
        done["create"] = timed(lambda: make_host_arrays(slabs, a.threads))[0]

    c = threading.Thread(target=create)
    c.start()
    t_gpu, _ = timed(lambda: mx.eval(busy))
    c.join()
    t_busy = done["create"]
    t_idle, _ = timed(lambda: make_host_arrays(slabs, a.threads))
    print(f"busy GPU ({reps} matmuls, {t_gpu:.2f} s): create {t_busy*1e3:.1f} ms; idle GPU: create {t_idle*1e3:.1f} ms")


if __name__ == "__main__":
    main()
