"""Sums Nsight Compute's `--csv --metrics gpu__time_duration.sum` output per kernel name:
launches, median and total GPU microseconds, largest first; with the metrics
launch__registers_per_thread and launch__grid_size also collected, a kernel's registers
and grid (those of its first launch).

usage: python3 ncu_times.py FILE.csv
"""
import csv
import statistics
import sys
from collections import defaultdict


def main():
    rows = [r for r in csv.reader(open(sys.argv[1])) if r]
    header = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    cols = rows[header]
    name, metric, value = cols.index("Kernel Name"), cols.index("Metric Name"), cols.index("Metric Value")
    times = defaultdict(list)
    launch = defaultdict(dict)
    for r in rows[header + 1:]:
        if len(r) != len(cols):
            continue
        if r[metric] == "gpu__time_duration.sum":
            times[r[name][:90]].append(float(r[value].replace(",", "")) / 1e3)
        elif r[metric] in ("launch__registers_per_thread", "launch__grid_size"):
            launch[r[name][:90]].setdefault(r[metric], r[value].replace(",", ""))
    print("| kernel | launches | median µs | max µs | total µs | registers | grid |")
    print("|---|---|---|---|---|---|---|")
    for k, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        regs = launch[k].get("launch__registers_per_thread", "")
        grid = launch[k].get("launch__grid_size", "")
        print(f"| {k} | {len(v)} | {statistics.median(v):.1f} | {max(v):.1f} | {sum(v):.0f} | {regs} | {grid} |")


if __name__ == "__main__":
    main()
