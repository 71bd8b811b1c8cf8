"""HTTP-server benchmark: mlx-serve vs mlx_lm.server on one model, same client, same prompts.

Starts each server on a free port (one at a time, never both), warms it up with untimed
requests of the same shapes, drives it with one streaming httpx client over
/v1/chat/completions, then stops it. Rounds alternate the order (ours first, then mlx-lm
first, ...) so load from other processes on the machine falls on both. A connection the
server drops before answering is retried by the client and counted.

Per request: TTFT (to the first content token), decode tok/s of the stream (tokens after
the first / time after the first), end-to-end latency. Per wave of C concurrent requests:
aggregate tok/s (all generated tokens / wall time of the wave). Per level: peak RSS of the
server process (VmHWM, reset before each level), and for mlx-serve where its engine thread's
time went during the waves (mlx_serve_engine_seconds_total by part: admitting, decode steps,
handing tokens over, joining, prefilling) with the decode steps' own tok/s. Prompt-cache case: a new long system prompt
with one question (cold: nothing to reuse), then the same system prompt with another
question of the same length (hit); their TTFTs are compared.

Generation is fixed-length on both: requests carry "ignore_eos": true (mlx-serve honours
it) and both servers load a copy of the model folder whose eos token is the last
(unused) vocabulary entry (mlx_lm.server has no ignore_eos). Every request's usage is
checked: completion_tokens must equal max_tokens.

usage: vendor/pyref/bin/python bench/server_bench.py --model DIR --mlx-serve PATH/mlx-serve
           [--concurrency 1,4,16] [--prompt-tokens 128] [--gen-tokens 64] [--waves 2]
           [--rounds 2] [--ref-first] [--prefix-tokens 1000] [--cache-reps 2] [--label COMMIT]
           [--warmup-prompt-tokens N] [--warmup-gen-tokens N] [--out bench/server_results.json]
On a slow CPU, short warm-ups (e.g. 16 and 8) save minutes: MLX's CPU backend compiles no
kernels per shape; on a GPU keep the default (warm-up of the timed shapes).
"""

import argparse, json, os, platform, statistics, subprocess, sys, tempfile, time
from pathlib import Path

from tokenizers import Tokenizer

import serving
from serving import Server, chat, fixed_length_model, make_text, run_wave

httpx = serving.httpx


# ---------------------------------------------------------------- one server session

def session(server, tok, a, rnd) -> dict:
    """Start, warm up, run every concurrency level and the prompt-cache case, stop."""
    out = {"server": server.name, "round": rnd, "startup_s": server.start(), "levels": {}, "cache": []}
    try:
        warm(server.url, tok, a, rnd)
        for c in a.concurrency:
            server.reset_peaks()
            before = engine_counters(server)
            waves = [run_wave(server.url, [chat(make_text(tok, a.prompt_tokens, f"{rnd}-{c}-{w}-{i}"))
                                           for i in range(c)], a.gen_tokens) for w in range(a.waves)]
            out["levels"][c] = {"waves": waves, "peak_rss_mib": server.peak_rss_mib()}
            if before is not None:
                after = engine_counters(server)
                out["levels"][c]["engine"] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        for k in range(a.cache_reps):
            out["cache"].append(cache_case(server.url, tok, a, f"{rnd}-{k}"))
        if server.name == "mlx-serve":
            out["metrics"] = decode_metrics(server.url)
    finally:
        server.stop()
    return out


def warm(url, tok, a, rnd):
    """Untimed waves at every level (prompts never reused later), by default of the timed shapes;
    --warmup-prompt-tokens/--warmup-gen-tokens shrink them where no kernel compiles per shape."""
    for c in a.concurrency:
        run_wave(url, [chat(make_text(tok, a.warmup_prompt_tokens, f"w{rnd}-{c}-{i}"))
                       for i in range(c)], a.warmup_gen_tokens)
    if a.warmup_prompt_tokens >= a.prompt_tokens:
        run_wave(url, [chat("hi", make_text(tok, a.prefix_tokens, f"wp{rnd}"))], a.warmup_gen_tokens)


def cache_case(url, tok, a, tag) -> dict:
    """A new long system prompt with one question (cold: nothing to reuse), then the same
    system prompt with another question of the same length (hit: should reuse the prefix)."""
    shared = make_text(tok, a.prefix_tokens, f"shared{tag}")
    cold = run_wave(url, [chat(make_text(tok, 24, f"p{tag}"), shared)], a.gen_tokens)
    hit = run_wave(url, [chat(make_text(tok, 24, f"q{tag}"), shared)], a.gen_tokens)
    return {"cold": cold["requests"][0], "hit": hit["requests"][0]}


ENGINE_PARTS = ("gather", "admit", "decode", "tokens", "join", "prefill")
# The decode steps' host time by what the host did (mlx_serve_decode_host_seconds_total).
HOST_PARTS = ("build", "launch", "wait")


def engine_counters(server):
    """mlx-serve's engine thread time by part of its turns, and its decode steps and rows (None
    for mlx_lm.server): their changes over a level's waves say where its wall time went."""
    if server.name != "mlx-serve":
        return None
    text = httpx.get(server.url + "/metrics", timeout=10).text
    out = {}
    for l in text.splitlines():
        name, _, value = l.rpartition(" ")
        for part in ENGINE_PARTS:
            if name == f'mlx_serve_engine_seconds_total{{phase="{part}"}}':
                out[part] = float(value)
        for part in HOST_PARTS:
            if name == f'mlx_serve_decode_host_seconds_total{{phase="{part}"}}':
                out[f"host_{part}"] = float(value)
        if name in ("mlx_serve_decode_steps_total", "mlx_serve_decode_rows_total"):
            out[name.removeprefix("mlx_serve_").removesuffix("_total")] = float(value)
    return out


def decode_metrics(url) -> dict:
    text = httpx.get(url + "/metrics", timeout=10).text
    wanted = ("mlx_serve_decode_steps_total", "mlx_serve_decode_rows_total")
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l.startswith(wanted)}


# ---------------------------------------------------------------- summary and report

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def summarize(sessions, name, a) -> dict:
    mine = [s for s in sessions if s["server"] == name]
    levels = {}
    for c in a.concurrency:
        waves = [w for s in mine for w in s["levels"][c]["waves"]]
        reqs = [r for w in waves for r in w["requests"]]
        levels[c] = {"ttft_ms": 1e3 * med([r["ttft_s"] for r in reqs]),
                     "decode_tps": med([r["decode_tps"] for r in reqs]),
                     "e2e_s": med([r["e2e_s"] for r in reqs]),
                     "aggregate_tps": med([w["aggregate_tps"] for w in waves]),
                     "peak_rss_mib": max(s["levels"][c]["peak_rss_mib"] for s in mine),
                     "prompt_tokens": med([r["prompt_tokens"] for r in reqs]),
                     "retries": sum(r["retries"] for r in reqs), "requests": len(reqs)}
        engine = [s["levels"][c]["engine"] for s in mine if "engine" in s["levels"][c]]
        if engine:
            # Summed over the sessions' waves: each part's share of the waves' wall time, and
            # the rows the decode steps gave per second of decode-step time alone.
            wall = sum(w["wall_s"] for w in waves)
            total = {k: sum(e.get(k, 0.0) for e in engine) for k in engine[0]}
            levels[c]["engine"] = {"wall_s": wall, **{f"{p}_s": total.get(p, 0.0) for p in ENGINE_PARTS},
                                   "decode_steps": total.get("decode_steps", 0.0),
                                   "decode_rows": total.get("decode_rows", 0.0),
                                   **{f"host_{p}_s": total.get(f"host_{p}", 0.0) for p in HOST_PARTS},
                                   "step_tps": total.get("decode_rows", 0.0) / total["decode"] if total.get("decode") else float("nan")}
    cases = [c for s in mine for c in s["cache"]]
    cache = {k: 1e3 * med([c[k]["ttft_s"] for c in cases]) for k in ("cold", "hit")}
    cache["cached_tokens"] = med([c["hit"]["cached_tokens"] for c in cases])
    cache["prompt_tokens"] = {k: med([c[k]["prompt_tokens"] for c in cases]) for k in ("cold", "hit")}
    return {"levels": levels, "cache": cache}


def check_lengths(sessions) -> list:
    """Every request must have generated exactly max_tokens with HTTP 200."""
    bad = []
    for s in sessions:
        reqs = [r for lv in s["levels"].values() for w in lv["waves"] for r in w["requests"]]
        reqs += [r for c in s["cache"] for r in c.values()]
        bad += [f'{s["server"]} round {s["round"]}: status {r["status"]}, {r["completion_tokens"]}'
                f'/{r["max_tokens"]} tokens, {r["retries"]} retries' for r in reqs
                if r["status"] != 200 or r["completion_tokens"] != r["max_tokens"]]
    return bad


def blank(summary):
    """`summary`'s shape with every number NaN: the reference's column when it did not run
    (--no-ref)."""
    if isinstance(summary, dict):
        return {k: blank(v) for k, v in summary.items()}
    return float("nan")


def row(label, ours, ref, fmt, higher_is_better):
    adv = (ours / ref if higher_is_better else ref / ours) if ours and ref else float("nan")
    return f"| {label} | {ours:{fmt}} | {ref:{fmt}} | {adv:.2f}× |"


def report(ours, ref, a) -> str:
    lines = []
    for c in a.concurrency:
        o, r = ours["levels"][c], ref["levels"][c]
        lines += [f"\n**Concurrency {c}** (prompt {o['prompt_tokens']:.0f} tokens, {a.gen_tokens} generated)\n",
                  "| metric (median) | mlx-serve | mlx_lm.server | ours better by |", "| --- | ---: | ---: | ---: |",
                  row("TTFT (ms)", o["ttft_ms"], r["ttft_ms"], ".0f", False),
                  row("decode tok/s per stream", o["decode_tps"], r["decode_tps"], ".1f", True),
                  row("end-to-end latency (s)", o["e2e_s"], r["e2e_s"], ".2f", False),
                  row("aggregate tok/s", o["aggregate_tps"], r["aggregate_tps"], ".1f", True),
                  row("peak RSS (MiB)", o["peak_rss_mib"], r["peak_rss_mib"], ".0f", False),
                  f"| connections dropped, retried | {o['retries']} of {o['requests']} | "
                  f"{r['retries']} of {r['requests']} | |"]
    lines += engine_report(ours, a)
    o, r = ours["cache"], ref["cache"]
    if not a.cache_reps:
        return "\n".join(lines)
    lines += [f"\n**Prompt cache** (~{a.prefix_tokens}-token system prompt; cold: first request with it, "
              f"{o['prompt_tokens']['cold']:.0f} tokens; hit: same system prompt, another question, "
              f"{o['prompt_tokens']['hit']:.0f} tokens; {a.gen_tokens} generated)\n",
              "| metric (median) | mlx-serve | mlx_lm.server | ours better by |", "| --- | ---: | ---: | ---: |",
              row("TTFT cold (ms)", o["cold"], r["cold"], ".0f", False),
              row("TTFT after shared prefix (ms)", o["hit"], r["hit"], ".0f", False),
              row("cold / hit speed-up", o["cold"] / o["hit"], r["cold"] / r["hit"], ".2f", True),
              f"| cached tokens reported | {o['cached_tokens']:.0f} | {r['cached_tokens']:.0f} | |"]
    return "\n".join(lines)


def engine_report(ours, a) -> list:
    """Where mlx-serve's wave time went, per level (its engine thread's parts; idle = the rest)."""
    levels = [(c, ours["levels"][c]["engine"]) for c in a.concurrency if "engine" in ours["levels"][c]]
    if not levels:
        return []
    lines = ["\n**mlx-serve's engine thread during the waves** (share of the waves' wall time; "
             "decode-step tok/s = rows decoded / decode-step seconds; a step's host ms: building its "
             "graphs / launching them / waiting for its tokens, means over the steps — a wait near "
             "zero means the host bounds the step)\n",
             "| streams | wall (s) | " + " | ".join(ENGINE_PARTS) + " | idle | rows / step | decode-step tok/s "
             "| step: build / launch / wait ms |",
             "| ---: | ---: |" + " ---: |" * (len(ENGINE_PARTS) + 4)]
    for c, e in levels:
        parts = [e[f"{p}_s"] / e["wall_s"] for p in ENGINE_PARTS]
        steps = e["decode_steps"]
        rows_per_step = e["decode_rows"] / steps if steps else float("nan")
        host = " / ".join(f"{1e3 * e.get(f'host_{p}_s', float('nan')) / steps:.2f}" if steps else "-" for p in HOST_PARTS)
        lines.append(f"| {c} | {e['wall_s']:.2f} | " + " | ".join(f"{x:.1%}" for x in parts)
                     + f" | {max(0.0, 1 - sum(parts)):.1%} | {rows_per_step:.2f} | {e['step_tps']:.1f} | {host} |")
    return lines


def environment(a, python) -> dict:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    ref_ver = subprocess.run([python, "-c", "import mlx_lm, mlx.core as mx; print(mlx_lm.__version__, mx.__version__)"],
                             capture_output=True, text=True).stdout.split()
    ours_ver = subprocess.run([a.mlx_serve, "--version"], capture_output=True, text=True,
                              env=serving.ours_env(a.mlx_serve, a.python)).stdout.strip()
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu, "cores": os.cpu_count(),
            "os": platform.platform(), "mlx_serve": f"{ours_ver} ({a.label})" if a.label else ours_ver,
            "mlx_lm": ref_ver[0] if ref_ver else "?", "mlx": ref_ver[1] if len(ref_ver) > 1 else "?",
            "command": " ".join([Path(sys.executable).name] + sys.argv)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-serve", required=True)
    ap.add_argument("--python", default=sys.executable, help="python with mlx-lm for mlx_lm.server")
    ap.add_argument("--concurrency", default="1,4,16", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--waves", type=int, default=2, help="timed waves per concurrency level and session")
    ap.add_argument("--rounds", type=int, default=2, help="sessions per server, order alternating")
    ap.add_argument("--warmup-prompt-tokens", type=int, default=None, help="default: --prompt-tokens")
    ap.add_argument("--warmup-gen-tokens", type=int, default=None, help="default: --gen-tokens")
    ap.add_argument("--prefix-tokens", type=int, default=1000)
    ap.add_argument("--cache-reps", type=int, default=2)
    ap.add_argument("--ref-first", action="store_true", help="round 0 starts with mlx_lm.server")
    ap.add_argument("--no-ref", action="store_true",
                    help="mlx-serve alone (its own figures across levels, e.g. 8 streams against 1; nothing compared with mlx-lm)")
    ap.add_argument("--label", default="", help="e.g. the commit of the mlx-serve binary")
    ap.add_argument("--ours-args", default="", help="extra flags for mlx-serve")
    ap.add_argument("--ref-args", default="", help="extra flags for mlx_lm.server")
    ap.add_argument("--out", default="bench/server_results.json")
    a = ap.parse_args()
    a.warmup_prompt_tokens = a.warmup_prompt_tokens or a.prompt_tokens
    a.warmup_gen_tokens = a.warmup_gen_tokens or a.gen_tokens

    work = Path(tempfile.mkdtemp(prefix="server-bench-"))
    model = work / "model"
    eos_id = fixed_length_model(Path(a.model), model)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    env = environment(a, a.python)
    print(f"# {env['date']}  {env['cpu']} ({env['cores']} cores)  work dir {work}  eos -> id {eos_id}", file=sys.stderr)

    def make(name):
        if name == "mlx-serve":
            return Server(name, "ours", serving.ours_argv(a.mlx_serve, model, a.ours_args.split()),
                          serving.ours_env(a.mlx_serve, a.python), work)
        return Server(name, "ref", serving.ref_argv(a.python, model, a.ref_args.split()), dict(os.environ), work)

    sessions, order = [], ["mlx-serve", "mlx_lm.server"][::-1 if a.ref_first else 1]
    if a.no_ref:
        order = ["mlx-serve"]
    for rnd in range(a.rounds):
        for name in (order if rnd % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            sessions.append(session(make(name), tok, a, rnd))
            print(f"# round {rnd} {name}: {time.perf_counter() - t0:.0f}s", file=sys.stderr)
            Path(a.out).write_text(json.dumps({"env": env, "args": vars(a), "partial": True,
                                               "sessions": sessions}, indent=1))

    ours = summarize(sessions, "mlx-serve", a)
    ref = blank(ours) if a.no_ref else summarize(sessions, "mlx_lm.server", a)
    bad = check_lengths(sessions)
    text = report(ours, ref, a)
    print(text)
    print("\nlength check: " + ("every request generated exactly max_tokens" if not bad else "FAILED:\n" + "\n".join(bad)))
    metrics = [s["metrics"] for s in sessions if "metrics" in s]
    print(f"mlx-serve /metrics at the end of each session: {metrics}")
    Path(a.out).write_text(json.dumps({"env": env, "args": vars(a), "eos_id": eos_id, "summary":
                                       {"mlx-serve": ours, "mlx_lm.server": ref}, "length_errors": bad,
                                       "sessions": sessions}, indent=1))
    print(f"raw numbers: {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
