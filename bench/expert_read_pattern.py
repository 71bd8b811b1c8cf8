#!/usr/bin/env python3
"""How fast the disk delivers a prefill layer's expert misses, by read pattern.

A streamed MoE layer reads each missing expert's tensors (gate/up/down
weight, scales, biases: nine slabs for a 4-bit model, three of them large).
In a stacked safetensors layout an expert's slab of one tensor lies right
after the previous expert's, so a prefill step that misses most of a layer's
experts can read runs of neighbours in one call. This reads, with O_DIRECT
and `--threads` reads in flight, the slabs of `--misses` random experts of
each of `--layers` layers of a model made by make_moe_model.py:

  per slab     one read per expert and tensor (nine per expert)
  runs         one read per run of neighbouring experts' slabs of a tensor,
               split at --run-mb

and prints GB/s of tensor bytes for each (a fresh set of layers per pattern,
so neither reads what the page cache or the device's cache just held).
"""
import argparse
import json
import mmap
import os
import random
import struct
import threading
import time
from pathlib import Path

ALIGN = 4096


def stacked_slabs(model):
    """{(layer, tensor name): (file, offset of expert 0's slab, slab bytes, experts)}."""
    out = {}
    for f in sorted(Path(model).glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if ".switch_mlp." not in name:
                continue
            layer = int(name.split(".layers.")[1].split(".")[0])
            begin, end = meta["data_offsets"]
            experts = meta["shape"][0]
            out[(layer, name)] = (str(f), 8 + n + begin, (end - begin) // experts, experts)
    return out


def jobs_for(slabs, layers, misses, run_bytes, coalesce, rng):
    """(file, offset, length) reads for `misses` random experts of each layer."""
    jobs = []
    for layer in layers:
        tensors = [v for (l, _), v in slabs.items() if l == layer]
        chosen = sorted(rng.sample(range(tensors[0][3]), misses))
        if not coalesce:
            # Expert by expert, its tensors together: the order the readers get.
            jobs += [(f, base + e * slab, slab) for e in chosen for f, base, slab, _ in tensors]
            continue
        for f, base, slab, _ in tensors:
            run = [chosen[0]]
            for e in chosen[1:] + [None]:
                if e is not None and e == run[-1] + 1 and (len(run) + 1) * slab <= run_bytes:
                    run.append(e)
                    continue
                jobs.append((f, base + run[0] * slab, len(run) * slab))
                run = [e]
    return jobs


def read_all(jobs, threads):
    lock, todo, done = threading.Lock(), list(reversed(jobs)), [0]

    def worker():
        fds, buf = {}, None
        while True:
            with lock:
                if not todo:
                    break
                f, off, n = todo.pop()
            start = off // ALIGN * ALIGN
            span = (off + n + ALIGN - 1) // ALIGN * ALIGN - start
            if buf is None or len(buf) < span:
                buf = mmap.mmap(-1, span)
            fd = fds.get(f) or fds.setdefault(f, os.open(f, os.O_RDONLY | os.O_DIRECT))
            got = 0
            while got < span:
                k = os.preadv(fd, [memoryview(buf)[got:span]], start + got)
                if k <= 0:
                    break
                got += k
            with lock:
                done[0] += n
        for fd in fds.values():
            os.close(fd)

    t0 = time.time()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return done[0], time.time() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--misses", type=int, default=96)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--run-mb", type=float, default=8)
    a = p.parse_args()
    slabs = stacked_slabs(a.model)
    n_layers = 1 + max(l for l, _ in slabs)
    rng = random.Random(0)
    order = rng.sample(range(n_layers), n_layers)
    for i, (label, coalesce) in enumerate([("per slab", False), ("runs", True), ("per slab", False), ("runs", True)]):
        layers = order[i * a.layers:(i + 1) * a.layers]
        if len(layers) < a.layers:
            break
        jobs = jobs_for(slabs, layers, a.misses, a.run_mb * 2**20, coalesce, rng)
        nbytes, secs = read_all(jobs, a.threads)
        print(f"{label:9s}: {len(jobs):6d} reads, {nbytes / 1e9:.2f} GB in {secs:.2f} s = {nbytes / 1e9 / secs:.2f} GB/s "
              f"({a.misses} experts of each of {a.layers} layers, {a.threads} in flight)", flush=True)


if __name__ == "__main__":
    main()
