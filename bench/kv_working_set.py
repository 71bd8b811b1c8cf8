"""The working memory a long context takes besides its KV cache, per KV format (issue 19).

Where attention reads a decoded copy of the history (TurboQuant's prefill chunks; every format
on a backend without fused attention, --kv-bits everywhere), the buffers one layer's attention
holds grow with the context: the memory plan must leave room for them or a long context passes
its budget. This measures that growth to set the plan's factors.

For each configuration one server runs (no budget, the prompt cache off); for each length one
request of that many random prompt tokens runs and MLX's peak is read from /health, after a
reset. The working set is the peak less the idle server's memory and the KV cache's bytes at that
length (the plan's bytes per token); its growth per token of context between the lengths is what
the plan must hold per token beside the cache.

usage: python bench/kv_working_set.py --model DIR --mlx-serve BIN --lengths 4096,8192 --out FILE.json
           [--configs fp16,kv8,balanced,compact] [--prefill-size 512] [--turbo-threshold 512]
"""

import argparse, json, sys, tempfile, time
from pathlib import Path

import serving
from serving import httpx  # whichever name this Python ships it under
from turbo_budget import FLAGS, fill, format_flags, plan_json


def flags(config, a) -> list:
    return format_flags(config, a.turbo_threshold) + ["--prompt-cache-bytes", "0", "--prefill-size", str(a.prefill_size)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-serve", required=True)
    ap.add_argument("--python", default=sys.executable, help="python whose MLX the binary may need (serving.ours_env)")
    ap.add_argument("--configs", default="fp16,kv8,balanced,compact")
    ap.add_argument("--lengths", default="4096,8192")
    ap.add_argument("--prefill-size", type=int, default=512)
    ap.add_argument("--turbo-threshold", type=int, default=512)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    configs, lengths = a.configs.split(","), sorted(int(n) for n in a.lengths.split(","))
    cfg_path = Path(a.model, "config.json")
    if any(c not in FLAGS for c in configs) or not cfg_path.exists() or len(lengths) < 2:
        ap.error(f"configs must be among {sorted(FLAGS)}, --model a model folder, and --lengths two or more")
    cfg = json.loads(cfg_path.read_text())
    cfg = cfg.get("text_config", cfg)
    env = serving.ours_env(a.mlx_serve, a.python)
    work = Path(tempfile.mkdtemp(prefix="kv-working-set-"))
    context = lengths[-1] + 8
    results = {"model": a.model, "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv), "cells": []}
    for c in configs:
        plan = plan_json(a.mlx_serve, a.model, context, flags(c, a), env)
        if "error" in plan:
            sys.exit(f"{c}: the plan refused: {plan['error']}")
        bpt = plan["kv_bytes_per_token"]  # the format's size, sinks and norms included
        cell = {"config": c, "kv_bytes_per_token": bpt, "runs": []}
        results["cells"].append(cell)
        server = serving.Server(f"ws-{c}", "ours", serving.ours_argv(a.mlx_serve, a.model, flags(c, a) + ["--context-length", str(context)]), env, work)
        try:
            server.start()
            for n in lengths:
                idle = server.mlx_memory()["active_bytes"]
                server.reset_peaks()
                r = fill(server.url, n - 1, 1, cfg["vocab_size"], n)
                peak = server.mlx_memory()["peak_bytes"]
                run = {"tokens": n, "status": r["status"], "idle_bytes": idle, "peak_bytes": peak, "wall_s": r["wall_s"]}
                if r["status"] == 200:
                    run["working_bytes"] = peak - idle - bpt * n
                else:  # a failed request measures nothing: keep why it failed
                    run["error"] = r.get("error")
                cell["runs"].append(run)
                serving.log(f"{c} {n}: {cell['runs'][-1]}")
        finally:
            server.stop()
        ok = [r for r in cell["runs"] if "working_bytes" in r]
        if len(ok) >= 2:
            (lo, hi) = (ok[0], ok[-1])
            cell["working_bytes_per_token"] = (hi["working_bytes"] - lo["working_bytes"]) / (hi["tokens"] - lo["tokens"])
        Path(a.out).write_text(json.dumps(results, indent=1))
    print(f"\n{a.model}: prefill size {a.prefill_size}, lengths {lengths}\n")
    print("| format | KV bytes/token | working bytes at each length | working bytes per token of context |")
    print("|---|---|---|---|")
    for cell in results["cells"]:
        at = ", ".join(f"{r['tokens']}: " + (f"{r['working_bytes'] / 1e6:.1f} MB" if "working_bytes" in r else f"HTTP {r['status']}") for r in cell["runs"])
        per_token = cell.get("working_bytes_per_token")
        print(f"| {cell['config']} | {cell['kv_bytes_per_token']:.0f} | {at} | {'-' if per_token is None else f'{per_token:.0f}'} |")


if __name__ == "__main__":
    main()
