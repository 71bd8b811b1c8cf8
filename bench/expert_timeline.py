#!/usr/bin/env python3
"""A streamed model's passes, from the server's trace log.

With `MLX_SERVE_LOG_LEVEL=trace` (or `--log-level trace`), every streamed MoE
layer that reads its router back logs one `expert step:` line: when it began
and ended (ms since the readers started), its misses, and how long it waited
for its router's choice and for its reads. This groups the lines into passes
of the model (a pass starts when the layer number does not grow: a prefill
chunk or a decode step) and prints, per pass, its span, the waits summed over
its layers, and the gap since the pass before (where the time outside the
streamed layers went: the engine between chunks, a kernel compiled at first
use, ...), and a narrow step's router wait by the misses of the layer before it.

usage: python3 bench/expert_timeline.py LOG [LOG...]   (or the log on stdin)
"""
import re
import statistics
import sys

LINE = re.compile(r"expert step: layer (\d+) (wide|narrow) at ([\d.]+) ms, (\d+) misses, "
                  r"router wait ([\d.]+) ms, read wait ([\d.]+) ms, done at ([\d.]+) ms")


def passes(lines):
    out, current = [], []
    for line in lines:
        m = LINE.search(line)
        if not m:
            continue
        step = {"layer": int(m[1]), "kind": m[2], "start": float(m[3]), "misses": int(m[4]),
                "router": float(m[5]), "read": float(m[6]), "end": float(m[7])}
        if current and step["layer"] <= current[-1]["layer"]:
            out.append(current)
            current = []
        current.append(step)
    if current:
        out.append(current)
    return out


def report(name, lines):
    rows = passes(lines)
    print(f"{name}: {len(rows)} passes")
    print(f"{'pass':>4} {'kind':>6} {'layers':>6} {'start s':>8} {'span s':>7} {'gap s':>6} {'router s':>8} {'reads s':>7} {'misses':>6}")
    end = None
    for i, p in enumerate(rows):
        gap = p[0]["start"] - end if end is not None else 0.0
        end = p[-1]["end"]
        kinds = {s["kind"] for s in p}
        print(f"{i:>4} {'/'.join(sorted(kinds)):>6} {len(p):>6} {p[0]['start'] / 1e3:8.2f} {(end - p[0]['start']) / 1e3:7.2f} "
              f"{gap / 1e3:6.2f} {sum(s['router'] for s in p) / 1e3:8.2f} {sum(s['read'] for s in p) / 1e3:7.2f} "
              f"{sum(s['misses'] for s in p):>6}")
    router_wait_by_installs(rows)


def router_wait_by_installs(rows, skip=3):
    """A narrow step's router wait by the misses of the layer before it (consecutive layers of
    the decode passes after the first `skip`, which compile kernels): the wait covers the device
    work queued since that layer's read-back, its installs among it, so a wait that grows with
    them prices an installed expert."""
    by = {}
    for p in [p for p in rows if all(s["kind"] == "narrow" for s in p)][skip:]:
        for prev, cur in zip(p, p[1:]):
            if cur["layer"] == prev["layer"] + 1:
                by.setdefault(min(prev["misses"], 3), []).append(cur["router"])
    if not by:
        return
    print("router wait (ms) by the misses of the layer before (narrow passes after the first "
          f"{skip}): misses, layers, median, p10, p90")
    for k in sorted(by):
        w = sorted(by[k])
        print(f"  {k}{'+' if k == 3 else ' '} {len(w):>6} {statistics.median(w):7.2f} {w[len(w) // 10]:7.2f} {w[9 * len(w) // 10]:7.2f}")


def main():
    if len(sys.argv) > 1:
        for path in sys.argv[1:]:
            with open(path) as f:
                report(path, f)
    else:
        report("stdin", sys.stdin)


if __name__ == "__main__":
    main()
