"""Sums Nsight Compute's `--csv --metrics gpu__time_duration.sum` output per kernel name:
launches, median and total GPU microseconds, largest first.

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
    for r in rows[header + 1:]:
        if len(r) == len(cols) and r[metric] == "gpu__time_duration.sum":
            times[r[name][:90]].append(float(r[value].replace(",", "")) / 1e3)
    print("| kernel | launches | median µs | max µs | total µs |")
    print("|---|---|---|---|---|")
    for k, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {k} | {len(v)} | {statistics.median(v):.1f} | {max(v):.1f} | {sum(v):.0f} |")


if __name__ == "__main__":
    main()
