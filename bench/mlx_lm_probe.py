"""Runs mlx_lm.server (same arguments) with two signal handlers, so the benchmarks read the
reference server's MLX memory counters the way they read mlx-serve's:

  SIGUSR1  zeroes MLX's peak-memory counter (mlx-serve does the same on SIGUSR1), then
           writes the file below;
  SIGUSR2  writes {"seq", "active_bytes", "peak_bytes", "cache_bytes"} to $MLX_MEMORY_FILE.

Python runs signal handlers on the main thread, where mlx_lm.server's serve_forever waits in
select(); the signal interrupts the wait, so the handler runs at once. MLX's counters belong
to its allocator (one per process, behind a lock), so reading them from this thread while the
generation thread runs is safe.
"""

import itertools, json, os, signal, sys

import mlx.core as mx
from mlx_lm import server

_seq = itertools.count(1)


def reset_peak(signum, frame):
    mx.reset_peak_memory()
    write_memory(signum, frame)  # tells the benchmark the reset happened


def write_memory(signum, frame):
    path = os.environ["MLX_MEMORY_FILE"]
    active = mx.get_active_memory()
    # After a reset MLX reads 0 until the next allocation; the peak is never below what is live.
    body = {"seq": next(_seq), "active_bytes": active, "peak_bytes": max(mx.get_peak_memory(), active),
            "cache_bytes": mx.get_cache_memory()}
    with open(path + ".tmp", "w") as f:
        json.dump(body, f)
    os.replace(path + ".tmp", path)  # readers never see half a file


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, reset_peak)
    signal.signal(signal.SIGUSR2, write_memory)
    sys.argv[0] = "mlx_lm.server"
    server.main()
