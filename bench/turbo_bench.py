"""TurboQuant against the 16-bit KV cache: decode tok/s and peak memory over prompt
lengths and stream counts, one process per run, the configurations alternating so drift
hits them alike; the table shows the median of the runs.

One stream runs `mlx-serve generate` (once untimed first, `--warmup`: GPU kernels compile per
shape, then the timed generation). N > 1 streams start the server with the configuration's
flags and send N chat requests of the prompt length at once, twice (the first wave warms
up; `--warm-context T` makes its prompts T tokens, for long cells); tok/s is then the
aggregate while every stream decodes (`serving.steady_decode_tps`) and peak memory MLX's
peak during the timed wave (the server's /health). Each server's start and wave is logged
with its time: on a fresh GPU machine a server's first start compiles kernels for minutes.
--out is rewritten after every run, so a run cut short by a time limit keeps those before it.

usage: python bench/turbo_bench.py --model DIR --mlx-serve BIN --out FILE.json
           [--contexts 4096,16384,32768,65536] [--configs fp16,balanced,compact]
           [--streams 1] [--gen-tokens 128] [--runs 2] [--warm-context T]
"""

import argparse, json, statistics, subprocess, sys, tempfile, time
from pathlib import Path

from tokenizers import Tokenizer

import serving

# The server's smallest default --prefill-size (the CPU's; a GPU's is 2048): prompt tokens a
# stream prefills per turn. Sizing the streams' extra tokens by it keeps every stream decoding
# until the last has prefilled on either backend (on a GPU, with tokens to spare).
PREFILL_CHUNK = 512

FLAGS = {"fp16": [], "balanced": ["--turbo-kv", "balanced"], "compact": ["--turbo-kv", "compact"],
         "paper": ["--turbo-kv", "paper"], "kv8": ["--kv-bits", "8", "--quantized-kv-start", "0"]}


def run(binary, model, prompt, gen, flags, env):
    # The prompt on stdin: 64K tokens of text are more than one argument may hold.
    out = subprocess.run([binary, "generate", "--model", str(model), "--prompt", "-", "--max-tokens", str(gen),
                          "--ignore-chat-template", "--ignore-eos", "--warmup", "--json"] + flags,
                         input=prompt + "\n", capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1][:200] if out.stderr.strip() else f"exit {out.returncode}"}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: r[k] for k in ("prompt_tokens", "prompt_tps", "generation_tps", "peak_memory_bytes")}


def serve(binary, model, waves, gen, flags, env, work):
    """The chat requests of `waves` (a warm-up wave, then the timed one), each wave's all at
    once, through the server."""
    warm, timed = waves
    server = serving.Server(f"turbo-{len(timed)}", "ours", serving.ours_argv(binary, model, flags), env, work)
    try:
        serving.log(f"  server up in {server.start():.1f} s")
        t0 = time.perf_counter()
        serving.run_wave(server.url, warm, gen)
        serving.log(f"  warm-up wave of {len(warm)} in {time.perf_counter() - t0:.1f} s")
        server.reset_peaks()
        t0 = time.perf_counter()
        w = serving.run_wave(server.url, timed, gen)
        serving.log(f"  timed wave of {len(timed)} in {time.perf_counter() - t0:.1f} s")
        bad = [r for r in w["requests"] if not serving.request_ok(r)]
        if bad:
            return {"error": f"{len(bad)} of {len(timed)} requests failed: {bad[0]['status']} {bad[0]['error'] or ''}"[:200]}
        tps = serving.steady_decode_tps(w["requests"])
        if tps is None:
            return {"error": "the streams never all decoded at once"}
        return {"prompt_tokens": w["requests"][0]["prompt_tokens"], "generation_tps": tps,
                "aggregate_tps": w["aggregate_tps"], "peak_memory_bytes": server.mlx_memory()["peak_bytes"]}
    except RuntimeError as e:  # the server refused the flags or died: say so in the cell, as `run` does
        return {"error": str(e)[:200]}
    finally:
        server.stop()

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-serve", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="4096,16384,32768,65536")
    ap.add_argument("--configs", default="fp16,balanced,compact")
    ap.add_argument("--streams", default="1", help="stream counts, e.g. 1,4,16")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--warm-context", type=int, default=0,
                    help="N-stream cells: the warm-up wave's prompt tokens (default: the cell's)")
    a = ap.parse_args()
    configs = a.configs.split(",")
    if any(c not in FLAGS for c in configs) or not Path(a.model, "config.json").exists():
        ap.error(f"configs must be among {sorted(FLAGS)}, and --model a model folder")
    if a.warm_context < 0:
        ap.error("--warm-context takes a number of tokens (0: the cell's)")
    tok = Tokenizer.from_file(str(Path(a.model) / "tokenizer.json"))
    env = serving.ours_env(a.mlx_serve, a.python)
    results = {"model": a.model, "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv), "cells": []}
    work = Path(tempfile.mkdtemp(prefix="turbo-bench-"))
    for streams, ctx in [(int(n), int(c)) for n in a.streams.split(",") for c in a.contexts.split(",")]:
        # The prompts, made once per cell: one for `generate`, or a warm-up and a timed wave
        # of distinct ones (no shared prefix for the prompt cache to reuse).
        if streams == 1:
            prompt = serving.make_text(tok, ctx, f"turbo-{ctx}")
        else:
            waves = [[[{"role": "user", "content": serving.make_text(tok, n, f"{tag}-{ctx}-{i}")}] for i in range(streams)]
                     for tag, n in (("warm", a.warm_context or ctx), ("timed", ctx))]
        gen = a.gen_tokens if streams == 1 else a.gen_tokens + streams * -(-ctx // PREFILL_CHUNK)
        runs = {c: [] for c in configs}
        done = list(results["cells"])
        for _ in range(a.runs):
            for c in configs:
                if streams == 1:
                    r = run(a.mlx_serve, a.model, prompt, gen, FLAGS[c], env)
                else:
                    r = serve(a.mlx_serve, a.model, waves, gen, FLAGS[c], env, work)
                runs[c].append(r)
                serving.log(f"{streams} x {ctx} {c}, run {len(runs[c])}: {r.get('generation_tps')} tok/s {r.get('error') or ''}")
                # Written after every run, so a run cut short by a time limit keeps the ones before it.
                results["cells"] = done + [cell(ctx, streams, c, gen, rs) for c, rs in runs.items() if rs]
                Path(a.out).write_text(json.dumps(results, indent=1))
        for got in results["cells"][len(done):]:
            serving.log(f"{streams} x {ctx} {got['config']}: {got['generation_tps']} tok/s, peak {got['peak_gb']} GB {got['error'] or ''}")
    print(table(results, configs))


def cell(ctx, streams, config, gen, rs) -> dict:
    """One table cell: the median of a configuration's runs at one context and stream count."""
    good = [r for r in rs if "error" not in r]
    return {"context": ctx, "streams": streams, "config": config, "gen_tokens": gen, "runs": rs,
            "generation_tps": statistics.median([r["generation_tps"] for r in good]) if good else None,
            "peak_gb": max(r["peak_memory_bytes"] for r in good) / 1e9 if good else None,
            "error": None if good else rs[0].get("error")}


def table(results, configs) -> str:
    head = ["streams", "prompt"] + [f"{c} tok/s" for c in configs] + [f"{c}/{configs[0]}" for c in configs[1:]] + [f"{c} peak GB" for c in configs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cells = {(c.get("streams", 1), c["context"], c["config"]): c for c in results["cells"]}
    for streams, ctx in sorted({(c.get("streams", 1), c["context"]) for c in results["cells"]}):
        got = [cells.get((streams, ctx, c)) or {} for c in configs]
        tps = [g.get("generation_tps") for g in got]
        row = [str(streams), str(ctx)] + [f"{t:.1f}" if t else ("failed" if g.get("error") else "-") for t, g in zip(tps, got)]
        row += [f"{t / tps[0]:.2f}x" if t and tps[0] else "-" for t in tps[1:]]
        row += [f"{g['peak_gb']:.2f}" if g.get("peak_gb") else "-" for g in got]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
