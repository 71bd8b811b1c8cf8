"""What a streamed expert's bytes cost on CUDA between the reader's copy and the GPU's use.

The expert reader copies each slab it reads into an MLX array made on the CPU
(`Array::from_bytes`); MLX's CUDA backend allocates such arrays in managed memory
(cudaMallocManaged), and its buffer cache hands a freed allocation of the same size back to
the next one (MLX advises only its small-size pool to be mapped by the devices, read in
MLX's allocator.cpp; a 786 KB slab is a plain managed allocation). The pool's update then
reads the slab in a GPU kernel. If the pages are on the
GPU from the buffer's last use, the CPU's copy faults them over to the host and the kernel's
first read faults them back: in a session-42 trace a streamed decode layer waited 0.70 ms
for its router plus ~0.85 ms for each expert the layer before installed (a resident layer's
step takes ~0.15 ms), and the reader's copies ran at ~1-1.4 GB/s a thread.

Per round, a layer's worth of slabs (--buffers of --size bytes, the Qwen3-30B-A3B 4-bit
expert's weight slab by default) is written by the CPU (ctypes.memmove, as the reader's copy)
and then read by one GPU evaluation (x + 0 for each, evaluated together, as a pool update),
the same buffers every round. Ways of holding them:
  managed   as MLX hands them out (what the server does)
  prefetch  the same, prefetched to the GPU after the write (cuMemPrefetchAsync)
  both-ways the same, also prefetched back to the host (and waited for) before the write
  host      the same, advised to stay on the host and be read by the GPU in place
            (cuMemAdvise: preferred location host, accessed by the device)
  device    arrays the GPU made (device memory; no CPU write: the launch-and-evaluate floor)
Prints, per way, the median write and use milliseconds a round and the write's GB/s.

usage: python3 bench/managed_staging_probe.py [--size 786432] [--buffers 12] [--rounds 30]
(on the GPU machine, after `source .device/cuda-env.sh`)
"""

import argparse
import ctypes
import statistics
import time

import mlx.core as mx
import numpy as np

ADVISE_PREFERRED_LOCATION, ADVISE_ACCESSED_BY = 3, 5  # CUmem_advise
LOCATION_DEVICE, LOCATION_HOST = 1, 2  # CUmemLocationType
DEVICE_CPU = -1  # CU_DEVICE_CPU, the older calls' host "device"


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class Driver:
    """The CUDA driver MLX runs on (MLX links the runtime statically, so the driver's calls are
    the ones a process can reach), its device 0's primary context current on this thread."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        version, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), ctypes.c_int(0)), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        # The driver exports each call's versions by name: the _v2 ones take a CUmemLocation
        # (CUDA 12.2 on), the plain ones a device number.
        self.located = hasattr(self.lib, "cuMemPrefetchAsync_v2") and hasattr(self.lib, "cuMemAdvise_v2")
        self.prefetch_call = self.lib.cuMemPrefetchAsync_v2 if self.located else self.lib.cuMemPrefetchAsync
        self.advise_call = self.lib.cuMemAdvise_v2 if self.located else self.lib.cuMemAdvise
        print(f"CUDA driver {version.value}, {'location' if self.located else 'device-number'} calls")

    @staticmethod
    def check(status, what):
        if status != 0:
            raise RuntimeError(f"{what} returned CUDA error {status}")

    def prefetch(self, ptr, size, to_host=False):
        """Queues the range's migration on the legacy default stream."""
        if self.located:
            where = MemLocation(LOCATION_HOST, 0) if to_host else MemLocation(LOCATION_DEVICE, 0)
            status = self.prefetch_call(ctypes.c_uint64(ptr), ctypes.c_size_t(size), where, ctypes.c_uint(0), ctypes.c_void_p(0))
        else:
            status = self.prefetch_call(ctypes.c_uint64(ptr), ctypes.c_size_t(size), ctypes.c_int(DEVICE_CPU if to_host else 0),
                                        ctypes.c_void_p(0))
        self.check(status, "cuMemPrefetchAsync")

    def wait(self):
        self.check(self.lib.cuStreamSynchronize(ctypes.c_void_p(0)), "cuStreamSynchronize")

    def advise(self, ptr, size, advice, on_host):
        if self.located:
            where = MemLocation(LOCATION_HOST, 0) if on_host else MemLocation(LOCATION_DEVICE, 0)
            status = self.advise_call(ctypes.c_uint64(ptr), ctypes.c_size_t(size), ctypes.c_int(advice), where)
        else:
            status = self.advise_call(ctypes.c_uint64(ptr), ctypes.c_size_t(size), ctypes.c_int(advice),
                                      ctypes.c_int(DEVICE_CPU if on_host else 0))
        self.check(status, f"cuMemAdvise({advice})")


def host_buffers(n, size):
    """n arrays made on the CPU (managed memory on CUDA) and their data pointers."""
    arrays = [mx.zeros((size,), dtype=mx.uint8, stream=mx.cpu) for _ in range(n)]
    mx.eval(arrays)
    return arrays, [np.asarray(a).__array_interface__["data"][0] for a in arrays]


def rounds(arrays, ptrs, src, n_rounds, after_write=None, before_write=None):
    writes, uses = [], []
    for _ in range(n_rounds):
        t0 = time.perf_counter()
        if before_write:
            before_write()
        for p in ptrs:
            ctypes.memmove(p, src, len(src))
        if after_write:
            after_write()
        t1 = time.perf_counter()
        mx.eval([mx.add(a, 0, stream=mx.gpu) for a in arrays])
        t2 = time.perf_counter()
        writes.append(t1 - t0)
        uses.append(t2 - t1)
    # What the GPU read is what the CPU wrote.
    got = np.array(mx.add(arrays[-1], 0, stream=mx.gpu))
    if got.tobytes() != src:
        raise SystemExit("the GPU read other bytes than the CPU wrote")
    return writes, uses


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=786432, help="bytes a slab (an A3B 4-bit expert projection's weight)")
    ap.add_argument("--buffers", type=int, default=12, help="slabs a round (a layer's misses)")
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    if not mx.is_available(mx.gpu):
        raise SystemExit("needs MLX's CUDA backend (run on the GPU machine)")
    mx.eval(mx.add(mx.zeros((1,)), 1, stream=mx.gpu))  # MLX's GPU backend up, its context made
    cuda = Driver()
    src = np.random.default_rng(0).integers(0, 255, a.size, dtype=np.uint8).tobytes()
    total = a.size * a.buffers
    results = {}

    arrays, ptrs = host_buffers(a.buffers, a.size)
    rounds(arrays, ptrs, src, 3)  # warm-up: kernels compiled, pages touched on both sides
    results["managed"] = rounds(arrays, ptrs, src, a.rounds)

    def prefetch():
        for p in ptrs:
            cuda.prefetch(p, a.size)

    def fetch_back():
        for p in ptrs:
            cuda.prefetch(p, a.size, to_host=True)
        cuda.wait()

    results["prefetch"] = rounds(arrays, ptrs, src, a.rounds, prefetch)
    results["both-ways"] = rounds(arrays, ptrs, src, a.rounds, prefetch, fetch_back)

    arrays, ptrs = host_buffers(a.buffers, a.size)
    for p in ptrs:
        cuda.advise(p, a.size, ADVISE_PREFERRED_LOCATION, on_host=True)
        cuda.advise(p, a.size, ADVISE_ACCESSED_BY, on_host=False)
    rounds(arrays, ptrs, src, 3)
    results["host"] = rounds(arrays, ptrs, src, a.rounds)

    device = [mx.zeros((a.size,), dtype=mx.uint8, stream=mx.gpu) for _ in range(a.buffers)]
    mx.eval(device)
    uses = []
    for _ in range(a.rounds + 3):
        t1 = time.perf_counter()
        mx.eval([mx.add(d, 0, stream=mx.gpu) for d in device])
        uses.append(time.perf_counter() - t1)
    results["device"] = ([0.0] * a.rounds, uses[3:])

    print(f"{a.buffers} slabs of {a.size} bytes a round ({total / 1e6:.2f} MB), {a.rounds} rounds, medians:")
    print("| way | CPU write ms | GPU use ms | write GB/s |")
    print("| --- | ---: | ---: | ---: |")
    for way, (writes, uses) in results.items():
        w, u = statistics.median(writes), statistics.median(uses)
        rate = f"{total / w / 1e9:.2f}" if w > 0 else "-"
        print(f"| {way} | {w * 1e3:.3f} | {u * 1e3:.3f} | {rate} |")


if __name__ == "__main__":
    main()
