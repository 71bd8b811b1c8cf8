"""Two (or more) mlx-serve builds side by side in one run: the same model, flags, prompts and
streaming client, one server process at a time. For engine changes: "does the new build batch
more, and is it as fast where nothing should change?"

Per (configuration x prompt length x concurrency) cell and build: aggregate tok/s over the
wave, aggregate decode tok/s while every stream decodes (the suite's steady state), median
per-stream decode tok/s and TTFT, and the mean rows per decode step read from
/metrics (mlx_serve_decode_rows_total / mlx_serve_decode_steps_total over the wave: how many
sequences each model call decoded). Each build runs every cell `--repeats` times, alternating
builds, and the median is reported, so a drift of the machine hits both builds alike.

usage: python bench/ab.py --model DIR --build NAME=BIN [--build NAME=BIN ...] --out FILE.json [--new-lengths]
           [--configs default,kv8] [--contexts 512,2048] [--concurrency 1,8] [--gen-tokens 64]
Prints a Markdown table; FILE.json holds every wave.
"""

import argparse, json, platform, statistics, subprocess, sys, time
from pathlib import Path

try:
    import httpx
except ImportError:
    import httpx2 as httpx
from tokenizers import Tokenizer

import serving
from serving import Server, chat, log, make_text, request_ok, run_wave, steady_decode_tps

CONFIGS = {
    "default": [],
    "kv8": ["--kv-bits", "8", "--quantized-kv-start", "0"],
    "kv4": ["--kv-bits", "4", "--quantized-kv-start", "0"],
}


def ints(s):
    return [int(x) for x in s.split(",") if x]


def counters(url) -> dict:
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        for name in ("mlx_serve_decode_rows_total", "mlx_serve_decode_steps_total"):
            if line.startswith(name + " "):
                out[name] = float(line.split()[1])
    return out


def wave(server, prompts, gen_tokens) -> dict:
    before = counters(server.url)
    w = run_wave(server.url, prompts, gen_tokens)
    after = counters(server.url)
    steps = after["mlx_serve_decode_steps_total"] - before["mlx_serve_decode_steps_total"]
    rows = after["mlx_serve_decode_rows_total"] - before["mlx_serve_decode_rows_total"]
    reqs = w["requests"]
    failed = [r for r in reqs if not request_ok(r)]
    return {
        "ok": not failed,
        "error": (failed[0]["error"] or str(failed[0]["status"])) if failed else None,
        "aggregate_tps": w["aggregate_tps"],
        "steady_tps": steady_decode_tps(reqs),
        "decode_tps": statistics.median([r["decode_tps"] for r in reqs if r["decode_tps"]] or [0.0]),
        "ttft_s": statistics.median([r["ttft_s"] for r in reqs]),
        "rows_per_step": rows / steps if steps else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--build", action="append", required=True, help="NAME=BIN (at least two)")
    ap.add_argument("--python", default=sys.executable, help="Python whose MLX library the builds load")
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="default,kv8")
    ap.add_argument("--contexts", type=ints, default=[512, 2048])
    ap.add_argument("--concurrency", type=ints, default=[1, 8])
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--new-lengths", action="store_true",
                    help="stream i's prompt is i+1 tokens shorter than the warm-up's: lengths the server has "
                         "not seen (a GPU builds kernels and attention plans per shape), as served prompts are")
    a = ap.parse_args()
    builds = dict(b.split("=", 1) for b in a.build)
    configs = a.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or len(builds) < 2 or not Path(a.model, "config.json").exists():
        ap.error(f"need two --build NAME=BIN, a model folder, known configs (unknown: {unknown})")
    for name, binary in builds.items():
        if not Path(binary).exists():
            ap.error(f"build {name}: no binary at {binary}")
    model = Path(a.out).with_suffix(".model")
    serving.fixed_length_model(Path(a.model), model)
    tok = Tokenizer.from_file(str(Path(a.model) / "tokenizer.json"))
    results = {"model": a.model, "machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M"),
               "command": " ".join(sys.argv), "builds": builds, "cells": []}
    for config in configs:
        servers = {name: Server(name, "ours", serving.ours_argv(binary, model, CONFIGS[config]),
                                serving.ours_env(binary, a.python), Path(a.out).parent / "ab-logs")
                   for name, binary in builds.items()}
        for context in a.contexts:
            for c in a.concurrency:
                # The same prompts for every build; distinct per stream (no prompt-cache hits).
                # The warm-up wave has the same shapes (GPU kernels compile per shape) and
                # other words, so it leaves nothing in the prompt cache the wave could reuse.
                length = (lambda i: context - 1 - i) if a.new_lengths else (lambda i: context)
                prompts = [chat(make_text(tok, length(i), f"{config}-{context}-{c}-{i}")) for i in range(c)]
                warm = [chat(make_text(tok, context, f"warm-{context}-{c}-{i}")) for i in range(c)]
                runs = {name: [] for name in builds}
                for rep in range(a.repeats):
                    for name, server in servers.items():
                        server.start()
                        try:
                            run_wave(server.url, warm, 4)
                            runs[name].append(wave(server, prompts, a.gen_tokens))
                        finally:
                            server.stop()
                for name, waves in runs.items():
                    good = [w for w in waves if w["ok"]]
                    cell = {"config": config, "context": context, "concurrency": c, "build": name,
                            "waves": waves, "ok": len(good) == len(waves)}
                    for k in ("aggregate_tps", "steady_tps", "decode_tps", "ttft_s", "rows_per_step"):
                        vals = [w[k] for w in good if w[k] is not None]
                        cell[k] = statistics.median(vals) if vals else None
                    results["cells"].append(cell)
                    log(f"{config} {context}x{c} {name}: {cell['aggregate_tps'] or 0:.1f} tok/s, "
                        f"{cell['rows_per_step'] or 0:.2f} rows/step")
                Path(a.out).write_text(json.dumps(results, indent=1))
    print(table(results, list(builds)))


def num(v, fmt) -> str:
    return "-" if v is None else format(v, fmt)


def table(results, names) -> str:
    base = names[0]
    head = ["config", "prompt", "streams"] + [f"{n} {k}" for n in names for k in ("tok/s", "decode tok/s", "rows/step")]
    head += [f"{n}/{base} decode" for n in names[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cells = {(c["config"], c["context"], c["concurrency"], c["build"]): c for c in results["cells"]}
    for (config, context, conc, build) in cells:
        if build != base:
            continue
        row = [config, str(context), str(conc)]
        got = [cells.get((config, context, conc, n)) for n in names]
        for g in got:
            if g and g["ok"]:
                row += [f"{g['aggregate_tps']:.1f}", num(g["steady_tps"], ".1f"), num(g["rows_per_step"], ".2f")]
            else:
                error = (((g or {}).get("waves") or [{}])[0].get("error") or "")[:60]
                row += [f"failed: {error}", "-", "-"]
        for g in got[1:]:
            ok = g and g["ok"] and got[0] and got[0]["ok"] and g["steady_tps"] and got[0]["steady_tps"]
            row.append(f"{g['steady_tps'] / got[0]['steady_tps']:.2f}x" if ok else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
