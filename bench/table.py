"""Prints the Markdown table of one or more generate_bench.py result files (--out JSON):
the same medians and ratios generate_bench.py prints, plus each metric's range over
the runs, so the spread is visible beside the ratio.

usage: python bench/table.py results.json [more.json ...]
"""

import json
import statistics
import sys

ROWS = [("prompt tok/s", "prompt_tps", None), ("generation tok/s", "generation_tps", None),
        ("TTFT ms", "ttft_ms", None), ("peak memory GB", "peak_memory_gb", "{:.3f}")]


def num(x, fmt):
    return (fmt or ("{:.0f}" if x >= 1000 else "{:.1f}")).format(x)


def cell(runs, key, fmt):
    v = [r[key] for r in runs]
    return f"{num(statistics.median(v), fmt)} ({num(min(v), fmt)}–{num(max(v), fmt)})"


def main():
    for path in sys.argv[1:]:
        d = json.load(open(path))
        ours, ref, a = d["ours"], d["mlx_lm"], d["args"]
        print(f"{path}: prompt {ours[0]['prompt_tokens']} tokens, {a['gen_tokens']} generated, "
              f"median (min–max) of {a['runs']} runs")
        print("| metric | mlx-serve | mlx-lm 0.32.2 | ratio |")
        print("| --- | --- | --- | --- |")
        for name, key, fmt in ROWS:
            o = statistics.median(r[key] for r in ours)
            m = statistics.median(r[key] for r in ref)
            print(f"| {name} | {cell(ours, key, fmt)} | {cell(ref, key, fmt)} | {o / m:.2f} |")
        print()


if __name__ == "__main__":
    main()
