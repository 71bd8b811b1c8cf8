"""Decode speed with a json_schema constraint vs without, on one mlx-serve server.

Both kinds of request stream /v1/chat/completions with the same prompts and max_tokens;
the constrained ones carry a response_format json_schema whose shortest valid output is far
longer than max_tokens (an array of many records), so both run exactly max_tokens tokens
and differ only in the grammar mask each step. `--schema typical`: records of free strings,
bounded integers, enums and booleans (what pydantic models give); `--schema bounded`: the
strings have maxLength, which llguidance cannot serve from its precomputed lexer slices, so
every in-string step walks the whole vocabulary (the slow case). Waves of C concurrent requests alternate
(free, constrained, free, ...) so drift falls on both. Per level: mean per-stream decode
tok/s and the steady aggregate tok/s (all streams decoding), constrained / free.

usage: vendor/pyref/bin/python bench/structured_bench.py --model DIR --mlx-serve PATH/mlx-serve
           [--schema typical|bounded] [--concurrency 1,8] [--prompt-tokens 64] [--gen-tokens 128] [--rounds 3]
           [--label COMMIT] [--out bench/results/structured.json]
"""

import argparse, json, platform, statistics, sys, tempfile, time
from pathlib import Path

from tokenizers import Tokenizer

import serving
from serving import Server, chat, make_text, ours_argv, ours_env, run_wave, steady_decode_tps, log

def constrained(kind):
    name = {"type": "string", "maxLength": 24} if kind == "bounded" else {"type": "string"}
    schema = {
        "type": "object",
        "properties": {"rows": {"type": "array", "minItems": 1000, "maxItems": 1000, "items": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 1000000},
                           "name": name,
                           "tag": {"enum": ["new", "old", "archived"]},
                           "ok": {"type": "boolean"}},
            "required": ["id", "name", "tag", "ok"], "additionalProperties": False}}},
        "required": ["rows"], "additionalProperties": False,
    }
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "rows", "strict": True, "schema": schema}}}


def grammar_counters(url):
    """(masked steps, mask host seconds, mask rows uploaded, mask rows reused) so far."""
    text = serving.httpx.get(url + "/metrics").text
    value = lambda name: next((float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " ")), 0.0)
    rows = lambda source: value('mlx_serve_grammar_mask_rows_total{source="%s"}' % source)
    return (value("mlx_serve_grammar_masks_total"), value("mlx_serve_grammar_mask_seconds_total"),
            rows("uploaded"), rows("reused"))


def measure(url, tok, a, c, rnd, extra):
    msgs = [chat("List the records as JSON. " + make_text(tok, a.prompt_tokens, f"{rnd}-{c}-{i}")) for i in range(c)]
    w = run_wave(url, msgs, a.gen_tokens, extra=extra)
    bad = [r for r in w["requests"] if not serving.request_ok(r)]
    if bad:
        raise RuntimeError(f"requests did not run max_tokens: {bad[0]['status']} {bad[0]['error']} {bad[0]['completion_tokens']}")
    per_stream = statistics.mean(r["decode_tps"] for r in w["requests"])
    return {"per_stream_tps": per_stream, "steady_tps": steady_decode_tps(w["requests"])}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--mlx-serve", required=True)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--schema", choices=["typical", "bounded"], default="typical")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--label", default="")
    p.add_argument("--out", default="bench/results/structured.json")
    a = p.parse_args()
    a.concurrency = [int(x) for x in a.concurrency.split(",")]
    CONSTRAINED = constrained(a.schema)
    tok = Tokenizer.from_file(str(Path(a.model) / "tokenizer.json"))
    server = Server("mlx-serve", "ours", ours_argv(a.mlx_serve, a.model, []), ours_env(a.mlx_serve, a.python), tempfile.mkdtemp())
    server.start()
    results = {}
    try:
        for c in a.concurrency:
            # Warm-up of both shapes (GPU kernels compile per shape; the grammar's vocabulary index is built once).
            for extra in (None, CONSTRAINED):
                measure(server.url, tok, a, c, "warm", extra)
            runs = {"free": [], "json_schema": []}
            steps0, seconds0, up0, re0 = grammar_counters(server.url)
            for rnd in range(a.rounds):
                for name, extra in (("free", None), ("json_schema", CONSTRAINED)):
                    runs[name].append(measure(server.url, tok, a, c, rnd, extra))
                    log(f"c={c} round {rnd} {name}: {runs[name][-1]}")
            steps1, seconds1, up1, re1 = grammar_counters(server.url)
            mask_ms = 1e3 * (seconds1 - seconds0) / max(steps1 - steps0, 1)
            uploaded, reused = up1 - up0, re1 - re0
            log(f"c={c}: {mask_ms:.3f} ms of grammar masks a step; mask rows uploaded {uploaded:.0f}, reused {reused:.0f}")
            med = {n: {k: statistics.median(r[k] for r in v if r[k] is not None) for k in ("per_stream_tps", "steady_tps")}
                   for n, v in runs.items()}
            results[c] = {"runs": runs, "median": med, "mask_ms_per_step": mask_ms,
                          "mask_rows_uploaded": uploaded, "mask_rows_reused": reused,
                          "ratio_per_stream": med["json_schema"]["per_stream_tps"] / med["free"]["per_stream_tps"],
                          "ratio_steady": med["json_schema"]["steady_tps"] / med["free"]["steady_tps"]}
        metrics = serving.httpx.get(server.url + "/metrics").text
    finally:
        server.stop()
    masks = [l for l in metrics.splitlines() if l.startswith("mlx_serve_grammar_mask")]
    out = {"date": time.strftime("%Y-%m-%d"), "label": a.label, "machine": platform.platform(), "model": a.model, "schema": a.schema,
           "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens, "levels": results, "grammar_metrics": masks}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"| streams | free tok/s per stream | json_schema tok/s per stream | ratio | free steady tok/s | json_schema steady tok/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for c, r in results.items():
        f, j = r["median"]["free"], r["median"]["json_schema"]
        print(f"| {c} | {f['per_stream_tps']:.1f} | {j['per_stream_tps']:.1f} | {r['ratio_per_stream']:.3f} | "
              f"{f['steady_tps']:.1f} | {j['steady_tps']:.1f} | {r['ratio_steady']:.3f} |")
    print("\n".join(masks))


if __name__ == "__main__":
    main()
