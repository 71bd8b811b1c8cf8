"""A decode step's GPU time by kernel, from Nsight Compute's `--csv --metrics
gpu__time_duration.sum` output of a program that runs decode steps (decode_step, the server).

The launches are cut into steps at the model's output projection: the launch with the
largest grid among the last `--tail` launches (the vocabulary's rows make it the widest
product of a step). The last `--steps` whole steps are summed per kernel name: launches and
GPU microseconds a step (their mean), largest first, and each step's total GPU time, which set
beside the step's wall time says whether the device or the host bounds it.

usage: python3 ncu_steps.py FILE.csv [--steps 2] [--tail 3000]
"""
import argparse
import csv
import re
from collections import defaultdict


def launches(path):
    rows = [r for r in csv.reader(open(path)) if r]
    header = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    cols = rows[header]
    ix = {c: cols.index(c) for c in ("ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Value")}
    out = []
    for r in rows[header + 1:]:
        if len(r) == len(cols) and r[ix["Metric Name"]] == "gpu__time_duration.sum":
            grid = [int(x) for x in re.findall(r"\d+", r[ix["Grid Size"]])]
            blocks = 1
            for g in grid:
                blocks *= g
            out.append((int(r[ix["ID"]]), r[ix["Kernel Name"]], blocks, float(r[ix["Metric Value"]].replace(",", "")) / 1e3))
    out.sort()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tail", type=int, default=3000)
    a = ap.parse_args()
    ls = launches(a.csv)
    tail = ls[-a.tail:]
    widest = max(tail, key=lambda l: l[2])
    marks = [i for i, l in enumerate(ls) if l[1] == widest[1] and l[2] == widest[2]]
    if len(marks) < a.steps + 1:
        raise SystemExit(f"only {len(marks)} launches of the step's marker ({widest[1][:60]}, {widest[2]} blocks)")
    steps = [ls[marks[j] + 1:marks[j + 1] + 1] for j in range(len(marks) - a.steps - 1, len(marks) - 1)]
    per = defaultdict(lambda: [0, 0.0])
    for s in steps:
        for _, name, _, us in s:
            per[name[:80]][0] += 1
            per[name[:80]][1] += us
    n = len(steps)
    print(f"marker: {widest[1][:80]} ({widest[2]} blocks); {len(marks)} marked steps, the last {n} summed")
    print("| kernel | launches a step | GPU µs a step |")
    print("|---|---:|---:|")
    for name, (count, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {count / n:.1f} | {us / n:.1f} |")
    totals = [sum(l[3] for l in s) for s in steps]
    print("each step: " + ", ".join(f"{len(s)} launches, {t / 1e3:.3f} ms GPU" for s, t in zip(steps, totals)))


if __name__ == "__main__":
    main()
