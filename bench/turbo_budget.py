"""The longest context one memory budget holds, per KV format (issue 19).

For each configuration the server's memory plan under `--memory-budget B` says how many KV
tokens fit (`mlx-serve --plan`: the pool left after the weights, the working reserve, for
TurboQuant the prompt it holds at 16 bits before compressing it, and attention's working memory,
which grows with the context where attention is unfused or reads a decoded history). Then the server runs under
that budget with its context set to that many tokens, one request fills it (a prompt of random
token ids, `--gen-tokens` generated), and MLX's peak memory is read from /health. Last, the
first configuration's server (the 16-bit cache) is asked for the longest configuration's
length: it must refuse it (400) where the compressed cache served it.

The prompt cache is off (`--prompt-cache-bytes 0`) in the plan and the servers alike, so the
whole pool is the KV cache's; one sequence runs at a time.

usage: python bench/turbo_budget.py --model DIR --mlx-serve BIN --budget 10g --out FILE.json
           [--configs fp16,kv8,balanced,compact] [--gen-tokens 32] [--turbo-threshold 4096]
           [--max-context N] (default: the model's max_position_embeddings)
"""

import argparse, json, random, subprocess, sys, tempfile, time
from pathlib import Path

import serving
from serving import httpx  # whichever name this Python ships it under

FLAGS = {"fp16": [], "kv8": ["--kv-bits", "8", "--quantized-kv-start", "0"],
         "balanced": ["--turbo-kv", "balanced"], "compact": ["--turbo-kv", "compact"], "paper": ["--turbo-kv", "paper"]}
# A context this short is held by every format, so the plan keeps the format the flags name
# (fp16 when none) and reports its pool.
PROBE_CONTEXT = 256


def format_flags(config, turbo_threshold) -> list:
    """The server flags of a KV format, TurboQuant's prefill threshold included."""
    return FLAGS[config] + (["--turbo-kv-prefill-threshold", str(turbo_threshold)] if config in ("balanced", "compact", "paper") else [])


def flags(config, a):
    return format_flags(config, a.turbo_threshold) + ["--memory-budget", a.budget, "--prompt-cache-bytes", "0"]


def plan_json(binary, model, context, extra, env) -> dict:
    """`mlx-serve --plan`'s JSON for `model` at `context` with the flags `extra`; {"error"} where it refuses."""
    out = subprocess.run([binary, "--model", model, "--plan", "--context-length", str(context)] + extra, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1][:400]}
    return json.loads(out.stdout[out.stdout.index("{"):])


def planned(a, config, env) -> dict:
    """The plan's KV format, bytes per token, pool and the longest context it holds for `config` under the budget."""
    plan = plan_json(a.mlx_serve, a.model, PROBE_CONTEXT, flags(config, a), env)
    if "error" in plan:
        return plan
    out = {k: plan[k] for k in ("kv_format", "kv_bytes_per_token", "kv_tokens", "kv_element_bits", "budget_bytes")}
    # The pool at the probe's context gave up that context's working memory (per token; a
    # fixed part the same at any length); the longest context gives up its own: the room is
    # shared by its tokens and their working memory.
    bpt, working = plan["kv_bytes_per_token"], plan["attention_working_bytes_per_token"]
    out["working_per_token"] = working
    out["working_fixed"] = plan["attention_working_bytes"] - working * plan["context"]
    out["longest"] = int((plan["kv_tokens"] * bpt + working * plan["context"]) / (bpt + working)) - 1
    return out


def fill(url, n_prompt, gen, vocab, seed) -> dict:
    """One request of `n_prompt` random token ids generating `gen` tokens."""
    rng = random.Random(seed)
    body = {"prompt": [rng.randrange(10, vocab) for _ in range(n_prompt)], "max_tokens": gen, "ignore_eos": True, "temperature": 0}
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json=body, timeout=7200)
    wall = time.perf_counter() - t0
    j = r.json()
    if r.status_code != 200:
        return {"status": r.status_code, "error": j.get("error", {}).get("message", r.text)[:300], "wall_s": wall}
    u = j["usage"]
    return {"status": 200, "prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"], "wall_s": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-serve", required=True)
    ap.add_argument("--python", default=sys.executable, help="python whose MLX the binary may need (serving.ours_env)")
    ap.add_argument("--budget", required=True, help="--memory-budget for every configuration, e.g. 10g")
    ap.add_argument("--configs", default="fp16,kv8,balanced,compact")
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--turbo-threshold", type=int, default=4096, help="--turbo-kv-prefill-threshold")
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    configs = a.configs.split(",")
    cfg_path = Path(a.model, "config.json")
    if any(c not in FLAGS for c in configs) or not cfg_path.exists():
        ap.error(f"configs must be among {sorted(FLAGS)}, and --model a model folder")
    cfg = json.loads(cfg_path.read_text())
    cfg = cfg.get("text_config", cfg)
    vocab = cfg["vocab_size"]
    max_context = a.max_context or cfg.get("max_position_embeddings") or 1 << 20
    env = serving.ours_env(a.mlx_serve, a.python)
    work = Path(tempfile.mkdtemp(prefix="turbo-budget-"))
    results = {"model": a.model, "budget": a.budget, "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv),
               "max_context": max_context, "cells": []}
    for c in configs:
        cell = {"config": c, "plan": planned(a, c, env)}
        results["cells"].append(cell)
        if "error" in cell["plan"]:
            serving.log(f"{c}: the plan refused: {cell['plan']['error']}")
            continue
        context = min(cell["plan"]["longest"], max_context)
        cell["context"] = context
        server = serving.Server(f"budget-{c}", "ours", serving.ours_argv(a.mlx_serve, a.model, flags(c, a) + ["--context-length", str(context)]), env, work)
        try:
            server.start()
            server.reset_peaks()
            cell["fill"] = fill(server.url, context - a.gen_tokens, a.gen_tokens, vocab, 1)
            cell["fill"].update(server.mlx_memory())
            cell["fill"]["peak_rss_mib"] = server.peak_rss_mib()
            cell["health_context"] = httpx.get(server.url + "/health", timeout=10).json()["capabilities"]["context_length"]
        except RuntimeError as e:  # the server refused its flags or died
            cell["error"] = str(e)[:300]
        finally:
            server.stop()
        serving.log(f"{c}: {cell['plan']['kv_format']} holds {context} tokens; filled: {cell.get('fill', cell.get('error'))}")
        Path(a.out).write_text(json.dumps(results, indent=1))
    # The first configuration asked for the longest one's length.
    served = [x for x in results["cells"] if x.get("fill", {}).get("status") == 200]
    first = results["cells"][0]
    if len(served) > 1 and "context" in first:
        longest = max(served, key=lambda x: x["context"])
        if longest["context"] > first["context"]:
            server = serving.Server("budget-over", "ours", serving.ours_argv(a.mlx_serve, a.model, flags(first["config"], a) + ["--context-length", str(first["context"])]), env, work)
            try:
                server.start()
                results["over"] = {"config": first["config"], "asked": longest["context"], "of": longest["config"],
                                   **fill(server.url, longest["context"] - a.gen_tokens, a.gen_tokens, vocab, 1)}
            finally:
                server.stop()
            serving.log(f"{first['config']} asked for {longest['config']}'s {longest['context']} tokens: {results['over']}")
    Path(a.out).write_text(json.dumps(results, indent=1))
    print(table(results))


def table(results) -> str:
    gb = lambda b: f"{b / 1e9:.2f}" if b else "-"
    lines = [f"budget {results['budget']}", "", "| format | bytes/token | longest context | attention's working GB | context served | peak GB (MLX) | peak RSS MiB | fill wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for x in results["cells"]:
        p, f = x["plan"], x.get("fill", {})
        if "error" in p:
            lines.append(f"| {x['config']} | - | refused: {p['error'][:120]} | - | - | - | - | - |")
            continue
        ok = f"{f['prompt_tokens'] + f['completion_tokens']}" if f.get("status") == 200 else f"error: {f.get('error') or x.get('error')}"
        working = p["working_per_token"] * x.get("context", 0) + p.get("working_fixed", 0)
        lines.append(f"| {p['kv_format']} | {p['kv_bytes_per_token']:.0f} | {p['longest']} | {working / 1e9:.2f} | {ok} | {gb(f.get('peak_bytes'))} | "
                     f"{f.get('peak_rss_mib', 0):.0f} | {f.get('wall_s', 0):.1f} |")
    if "over" in results:
        o = results["over"]
        lines += ["", f"{o['config']} asked for {o['of']}'s {o['asked']} tokens: HTTP {o['status']} {o.get('error', '')}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
