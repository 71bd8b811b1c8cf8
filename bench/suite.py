"""The benchmark matrix: mlx-serve vs mlx_lm.server on one model, side by side.

For each configuration (default, --kv-bits 8, --kv-bits 4, ...) each server is started on a
free port (one process at a time, never both), warmed up, driven through every
(prompt length x concurrency) cell with the same streaming client and the same prompts, put
through the prompt-cache regression, and stopped. Per cell: TTFT, per-stream decode tok/s,
end-to-end latency, aggregate tok/s, peak RSS and MLX peak memory (both reset before the
cell), and the roofline limit from the bandwidth measured at the start of the run.

Prompt-cache regression (per server and configuration): `--clients` clients, each with its
own long document (~5.5K tokens), for `--rounds` rounds send the document with a new question,
then a short request (~18 prompt tokens). From round 2 the long requests should reuse the document
from the prompt cache (cached_tokens, or a TTFT at most half of round 1's where a server does
not report them), memory should stay flat, and nothing should fail.

Generation is fixed-length on both servers (eos moved to an unused token, ignore_eos sent),
and every request's usage is checked. Results go to OUT as JSON (meta.json, roofline.json,
cells.json, cache_regression.json) written after every cell, so a run that stops (a time
limit) continues where it left off when the same command runs again; then report.py writes
report.md and the charts.

usage: python bench/suite.py --model DIR --mlx-serve BIN --out DIR [options]   (see --help)
"""

import argparse, json, os, platform, shutil, signal, statistics, subprocess, sys, tempfile, time
from pathlib import Path

from tokenizers import Tokenizer

import roofline
import serving
from serving import Server, chat, log, make_text, request_ok, run_wave, steady_decode_tps

# Both servers take these flags; quantized-kv-start 0 makes the KV quantization apply at every
# prompt length (by default both start it at 5000 tokens).
CONFIGS = {
    "default": [],
    "kv8": ["--kv-bits", "8", "--quantized-kv-start", "0"],
    "kv4": ["--kv-bits", "4", "--quantized-kv-start", "0"],
}
KV_BITS = {"default": None, "kv8": 8, "kv4": 4}
# Both servers get the same prompt-cache budget (mlx_lm.server's default is unbounded in bytes,
# 10 entries): mlx-serve's default of 2 GiB, or more where the regression's documents need it
# (all clients' documents twice over), so that its repeats can hit in either server.
DEFAULT_PROMPT_CACHE_BYTES = 2 << 30


def prompt_cache_bytes(a, roof) -> int:
    need = 2 * a.clients * (a.long_tokens + 64) * roof["kv_bytes_per_token"]["default"]
    return max(DEFAULT_PROMPT_CACHE_BYTES, need)
SERVERS = {"ref": "mlx_lm.server", "ours": "mlx-serve"}


def ints(s):
    return [int(x) for x in s.split(",") if x]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model folder (safetensors, config, tokenizer)")
    ap.add_argument("--model-name", default=None, help="name in the report (default: folder name)")
    ap.add_argument("--mlx-serve", required=True, help="the mlx-serve binary")
    ap.add_argument("--python", default=sys.executable, help="Python with mlx-lm, for mlx_lm.server")
    ap.add_argument("--out", required=True, help="results folder (created; reused to resume)")
    ap.add_argument("--contexts", type=ints, default=[512, 4096, 16384, 32768])
    ap.add_argument("--concurrency", type=ints, default=[1, 4, 16])
    ap.add_argument("--configs", default="default,kv8,kv4")
    ap.add_argument("--servers", default="ref,ours", help="which servers, first one first in each config")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--max-wave-tokens", type=int, default=None,
                    help="skip cells whose concurrency x prompt length is above this (time on slow machines)")
    ap.add_argument("--memory-gib", type=float, default=None,
                    help="memory the cells may plan to use (default: 80%% of the GPU's, or half of RAM on CPU)")
    ap.add_argument("--warmup-gen-tokens", type=int, default=8)
    ap.add_argument("--regression", default=True, action=argparse.BooleanOptionalAction)
    ap.add_argument("--long-tokens", type=int, default=5500)
    ap.add_argument("--short-tokens", type=int, default=5,
                    help="short request's text tokens (~18 prompt tokens with a ChatML template)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--regression-gen-tokens", type=int, default=32)
    ap.add_argument("--commit", default=None, help="mlx-serve's commit (default: git, or .device/commit)")
    ap.add_argument("--command", default=None, help="the command to record (default: this one)")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds after which no new cell or regression starts (the next run resumes)")
    ap.add_argument("--no-report", action="store_true")
    a = ap.parse_args()
    a.configs = [c for c in a.configs.split(",") if c]
    unknown = [c for c in a.configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; known: {sorted(CONFIGS)}")
    a.servers = [s for s in a.servers.split(",") if s]
    unknown = [s for s in a.servers if s not in SERVERS]
    if unknown:
        ap.error(f"unknown server(s) {unknown}; known: {sorted(SERVERS)}")
    if not (Path(a.model) / "config.json").is_file():
        ap.error(f"--model {a.model}: no config.json there (make one with bench/make_model.py)")
    if not Path(a.mlx_serve).is_file():
        ap.error(f"--mlx-serve {a.mlx_serve}: no such file (./build.sh builds target/release/mlx-serve)")
    return a


# ---------------------------------------------------------------- the machine and the run

def gpu_info() -> tuple[str, float] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out:
        return None
    name, mib = out[0].rsplit(",", 1)
    return name.strip(), float(mib) / 1024


def ram_gib() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / (1 << 20)
    return float("nan")


def commit_of(a) -> str:
    if a.commit:
        return a.commit
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=serving.BENCH, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=serving.BENCH, timeout=10).stdout.strip()
        if sha:
            return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    f = Path(a.mlx_serve).resolve().parent.parent / "commit"  # written by scripts/device-bundle.sh
    return f.read_text().strip() if f.exists() else "unknown"


def meta(a, backend) -> dict:
    gpu = gpu_info()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    mlx_lm, mlx = serving.python_versions(a.python)
    ours = subprocess.run([a.mlx_serve, "--version"], capture_output=True, text=True,
                          env=serving.ours_env(a.mlx_serve, a.python)).stdout.strip()
    q = json.loads((Path(a.model) / "config.json").read_text()).get("quantization")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": gpu[0] if gpu and backend == "cuda" else f"{cpu} (CPU)",
        "backend": backend,
        "device_memory_gib": round(gpu[1] if gpu and backend == "cuda" else ram_gib(), 1),
        "cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(),
        "mlx": mlx, "mlx_lm": mlx_lm, "mlx_serve": ours, "commit": commit_of(a),
        "command": a.command or " ".join(["python", "bench/suite.py"] + sys.argv[1:]),
        "model": {"name": a.model_name or Path(a.model).name, "path": str(a.model),
                  "weight_bytes": roofline.weight_bytes_on_disk(Path(a.model)),
                  "quantization": f"{q['bits']}-bit, group {q['group_size']}" if q else "none"},
        "gen_tokens": a.gen_tokens, "contexts": a.contexts, "concurrency": a.concurrency,
        "configs": {c: {"ours": CONFIGS[c], "ref": CONFIGS[c]} for c in a.configs},
        "harness": {"warmup_gen_tokens": a.warmup_gen_tokens,
                    "max_wave_tokens": a.max_wave_tokens, "memory_gib": a.memory_gib},
    }


def backend_of(python) -> str:
    out = subprocess.run([python, "-c", "import mlx.core as mx; print(mx.default_device())"],
                         capture_output=True, text=True).stdout
    return "cuda" if "gpu" in out else "cpu"


# ---------------------------------------------------------------- results on disk

class Results:
    """The JSON files in OUT; every write replaces a whole file, so a stopped run leaves
    complete files and the next run picks them up."""

    def __init__(self, out: Path):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.cells = self.load("cells.json", [])
        self.regression = self.load("cache_regression.json", {})

    def load(self, name, default):
        p = self.out / name
        return json.loads(p.read_text()) if p.exists() else default

    def save(self, name, value):
        tmp = self.out / (name + ".tmp")
        tmp.write_text(json.dumps(value, indent=1))
        os.replace(tmp, self.out / name)

    def cell(self, server, config, context, c):
        return next((x for x in self.cells if (x["server"], x["config"], x["context"], x["concurrency"])
                     == (server, config, context, c)), None)

    def put_cell(self, cell):
        self.cells = [x for x in self.cells if (x["server"], x["config"], x["context"], x["concurrency"]) !=
                      (cell["server"], cell["config"], cell["context"], cell["concurrency"])] + [cell]
        self.save("cells.json", self.cells)

    def put_regression(self, key, value):
        self.regression[key] = value
        self.save("cache_regression.json", self.regression)


# ---------------------------------------------------------------- one cell

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def plan_skip(a, model_ctx, roof, config, context, c) -> str | None:
    """Why a cell cannot run here, or None."""
    if model_ctx and context + a.gen_tokens > model_ctx:
        return f"beyond the model's context ({model_ctx} tokens)"
    if a.max_wave_tokens and c * context > a.max_wave_tokens:
        return f"{c} x {context} prompt tokens is over --max-wave-tokens {a.max_wave_tokens}"
    kv = roof["kv_bytes_per_token"][config] * c * (context + a.gen_tokens)
    need = (roof["weight_bytes_on_disk"] + kv + prompt_cache_bytes(a, roof)) / (1 << 30)
    if need > a.memory_gib:
        return f"needs about {need:.0f} GiB (weights, {c} KV caches, prompt cache) of the {a.memory_gib:.0f} GiB planned"
    return None


def run_cell(server, tok, a, config, context, c, roof) -> dict:
    base = {"server": server.name, "config": config, "context": context, "concurrency": c}
    prompts = [chat(make_text(tok, context, f"{server.name}-{config}-{context}-{c}-{i}")) for i in range(c)]
    server.reset_peaks()
    w = run_wave(server.url, prompts, a.gen_tokens)
    time.sleep(0.2)
    mem = server.mlx_memory()
    reqs = w["requests"]
    bad = [r for r in reqs if not request_ok(r)]
    decode_agg = steady_decode_tps(reqs)
    t0 = min(r["start"] for r in reqs)
    kv = roof["kv_bytes_per_token"][config]
    cell = dict(base, status="failed" if bad else "ok",
                prompt_tokens=med([r["prompt_tokens"] for r in reqs]), gen_tokens=a.gen_tokens,
                requests=len(reqs), errors=len(bad),
                ttft_ms=1e3 * med([r["ttft_s"] for r in reqs]), ttft_ms_max=1e3 * max(r["ttft_s"] for r in reqs),
                decode_tps=med([r["decode_tps"] for r in reqs]), e2e_s=med([r["e2e_s"] for r in reqs]),
                aggregate_tps=w["aggregate_tps"], decode_aggregate_tps=decode_agg, wall_s=w["wall_s"],
                peak_rss_mib=server.peak_rss_mib(),
                mlx_peak_mib=mem["peak_bytes"] / (1 << 20) if mem["peak_bytes"] is not None else None,
                roofline_tps=roofline.roofline_tps(roof["bandwidth_gbs"], roof["weight_bytes_per_token"], kv,
                                                   context, c, a.gen_tokens),
                # Per stream, seconds from the wave's start: sent, first token, last token.
                streams=[[round(r["start"] - t0, 3), round((r["first"] or r["end"]) - t0, 3),
                          round((r["last"] or r["end"]) - t0, 3)] for r in reqs])
    if bad:
        r = bad[0]
        cell["reason"] = (f"{len(bad)} of {len(reqs)} requests failed; first: status {r['status']}, "
                          f"{r['completion_tokens']}/{r['max_tokens']} tokens {r['error'] or ''}").strip()
        cell["server_log"] = server.log_tail()
    return cell


# ---------------------------------------------------------------- prompt-cache regression

def regression(server, tok, a, config) -> dict:
    """Long/short alternation over rounds, all clients at once (see the module doc)."""
    import asyncio
    docs = [make_text(tok, a.long_tokens, f"doc-{server.name}-{config}-{i}") for i in range(a.clients)]
    rounds, errors = [], 0

    async def client(http, i, rnd):
        long = await serving.stream_request(http, server.url, chat(f"Question {rnd} about it?", docs[i]),
                                            a.regression_gen_tokens)
        short = await serving.stream_request(http, server.url,
                                             chat(make_text(tok, a.short_tokens, f"s-{config}-{rnd}-{i}")),
                                             a.regression_gen_tokens)
        return long, short

    async def one_round(rnd):
        async with serving.client_for(a.clients) as http:
            return await asyncio.gather(*(client(http, i, rnd) for i in range(a.clients)))

    for rnd in range(1, a.rounds + 1):
        server.reset_peaks()
        pairs = asyncio.run(one_round(rnd))
        time.sleep(0.2)
        mem = server.mlx_memory()
        reqs = [r for p in pairs for r in p]
        bad = sum(not request_ok(r) for r in reqs)
        errors += bad
        mib = lambda b: b / (1 << 20) if b is not None else None
        rounds.append({"round": rnd, "long_ttft_ms": [1e3 * p[0]["ttft_s"] for p in pairs],
                       "short_ttft_ms": [1e3 * p[1]["ttft_s"] for p in pairs],
                       "long_cached_tokens": [p[0]["cached_tokens"] for p in pairs],
                       "short_cached_tokens": [p[1]["cached_tokens"] for p in pairs],
                       "long_prompt_tokens": med([p[0]["prompt_tokens"] for p in pairs]),
                       "short_prompt_tokens": med([p[1]["prompt_tokens"] for p in pairs]),
                       "errors": bad, "rss_mib": server.rss_mib(), "peak_rss_mib": server.peak_rss_mib(),
                       "mlx_active_mib": mib(mem["active_bytes"]), "mlx_peak_mib": mib(mem["peak_bytes"])})
        log(f"  regression round {rnd}: long TTFT {med(rounds[-1]['long_ttft_ms']):.0f} ms, "
            f"cached {rounds[-1]['long_cached_tokens']}, errors {bad}")
    return {"server": server.name, "config": config, "clients": a.clients,
            "long_prompt_tokens": rounds[0]["long_prompt_tokens"], "short_prompt_tokens": rounds[0]["short_prompt_tokens"],
            "rounds": rounds, "verdict": verdict(rounds, errors)}


def verdict(rounds, errors) -> dict:
    notes = []
    later = rounds[1:]
    doc = rounds[0]["long_prompt_tokens"] or 0
    reported = [c for r in later for c in r["long_cached_tokens"] if c is not None]
    if reported and len(reported) == sum(len(r["long_cached_tokens"]) for r in later):
        hits = all(c >= 0.9 * doc for c in reported)
        notes.append(f"repeats reused {min(reported)}-{max(reported)} of ~{doc:.0f} prompt tokens")
    elif later:
        first = med(rounds[0]["long_ttft_ms"])
        rest = med([t for r in later for t in r["long_ttft_ms"]])
        hits = rest <= 0.5 * first
        notes.append(f"no cached_tokens reported; repeat TTFT {rest:.0f} ms vs first {first:.0f} ms")
    else:
        hits = None
    key = "mlx_active_mib" if all(r["mlx_active_mib"] is not None for r in rounds) else "rss_mib"
    stable = True
    if len(rounds) > 2:
        base = rounds[1][key]
        top = max(r[key] for r in rounds[1:])
        stable = top <= base * 1.10 + 64
        notes.append(f"{key.replace('_mib', '')} after rounds 2-{len(rounds)}: {base:.0f} to {top:.0f} MiB")
    return {"hits_on_repeats": hits, "memory_stable": stable, "errors": errors,
            "ok": bool(hits) and stable and errors == 0, "notes": "; ".join(notes)}


# ---------------------------------------------------------------- sessions

class OutOfTime(Exception):
    """--time-budget is spent: stop cleanly, leaving the rest to the next run."""


def check_time(a):
    if a.time_budget is not None and time.monotonic() - a.started > a.time_budget:
        raise OutOfTime()

def warm_up(server, tok, a, cells) -> str | None:
    """Untimed: every concurrency level at the shortest prompt, then one request per longer
    prompt length, so kernel compilation (CUDA JIT) stays out of the cells. Returns why the
    first request failed, if it did (then the configuration does not run at all here)."""
    shortest = min(L for L, _ in cells)
    first = run_wave(server.url, [chat(make_text(tok, shortest, "warm-first"))], a.warmup_gen_tokens)["requests"][0]
    if not request_ok(first):
        return (f"status {first['status']}, {first['completion_tokens']}/{first['max_tokens']} tokens "
                f"{first['error'] or ''}; server log: {server.log_tail()}")
    for c in sorted({c for _, c in cells}):
        run_wave(server.url, [chat(make_text(tok, shortest, f"warm-{c}-{i}")) for i in range(c)], a.warmup_gen_tokens)
    for L in sorted({L for L, _ in cells if L > shortest}):
        run_wave(server.url, [chat(make_text(tok, L, f"warm-L{L}"))], a.warmup_gen_tokens)
    # The long prompts leave large buffers in MLX's cache; one more short request returns to
    # the first cell's shapes.
    run_wave(server.url, [chat(make_text(tok, shortest, "warm-last"))], a.warmup_gen_tokens)
    settle(server)
    return None


def settle(server):
    """Lets work a client no longer waits for (cache bookkeeping, a dropped request's tail)
    finish, so it does not land in the next cell's numbers."""
    if server.kind == "ours":
        server.mlx_memory()  # returns once no sequence is running
    time.sleep(2)


def session(kind, config, a, model, tok, res, roof, model_ctx):
    name = SERVERS[kind]
    cells = [(L, c) for L in a.contexts for c in a.concurrency]
    todo = []
    for L, c in cells:
        if res.cell(name, config, L, c):
            continue
        why = plan_skip(a, model_ctx, roof, config, L, c)
        if why:
            res.put_cell({"server": name, "config": config, "context": L, "concurrency": c,
                          "status": "skipped", "reason": why})
        else:
            todo.append((L, c))
    need_regression = a.regression and f"{name}/{config}" not in res.regression
    if not todo and not need_regression:
        return
    flags = CONFIGS[config] + ["--prompt-cache-bytes", str(prompt_cache_bytes(a, roof))]
    if kind == "ours":
        server = Server(name, kind, serving.ours_argv(a.mlx_serve, model, flags),
                        serving.ours_env(a.mlx_serve, a.python), a.out / "logs")
    else:
        server = Server(name, kind, serving.ref_argv(a.python, model, flags), dict(os.environ), a.out / "logs")
    check_time(a)
    log(f"{name} {config}: starting ({len(todo)} cells{', regression' if need_regression else ''})")
    server.start()
    try:
        if todo:
            t0 = time.perf_counter()
            broken = warm_up(server, tok, a, todo)
            log(f"  warm-up {time.perf_counter() - t0:.0f} s" + (f": FAILED {broken}" if broken else ""))
            if broken:
                for L, c in todo:
                    res.put_cell({"server": name, "config": config, "context": L, "concurrency": c,
                                  "status": "failed", "reason": f"not run: the first warm-up request failed ({broken})"})
                if need_regression:
                    res.put_regression(f"{name}/{config}", {
                        "server": name, "config": config, "clients": a.clients, "rounds": [],
                        "verdict": {"hits_on_repeats": None, "memory_stable": None, "errors": 0, "ok": False,
                                    "notes": f"not run: the first warm-up request failed ({broken})"}})
                return
        for L, c in todo:
            check_time(a)
            t0 = time.perf_counter()
            try:
                cell = run_cell(server, tok, a, config, L, c, roof)
            except Exception as e:  # a crash or a hang is a result too; go on with the next cell
                cell = {"server": name, "config": config, "context": L, "concurrency": c, "status": "failed",
                        "reason": f"{type(e).__name__}: {e}"[:300]}
            res.put_cell(cell)
            log(f"  {L:>6} x {c:<2} {cell['status']}: " + (
                f"TTFT {cell['ttft_ms']:.0f} ms, decode {cell['decode_tps'] or 0:.1f} tok/s/stream, "
                f"aggregate {cell['aggregate_tps']:.1f} tok/s, MLX peak {cell['mlx_peak_mib'] or 0:.0f} MiB "
                f"({time.perf_counter() - t0:.0f} s)" if cell["status"] == "ok" else cell.get("reason", "")))
            if cell["status"] != "ok" and not server.healthy():
                # e.g. mlx_lm.server after an out-of-memory error: the process lives on, its
                # generation thread does not. Later cells get a new process.
                log(f"  {name} no longer generates; restarting it")
                server.stop()
                server.start()
                warm_up(server, tok, a, [(min(L for L, _ in todo), 1)])
            else:
                settle(server)
        if need_regression:
            check_time(a)
            res.put_regression(f"{name}/{config}", regression(server, tok, a, config))
    finally:
        server.stop()


def roofline_facts(a, res) -> dict:
    roof = res.load("roofline.json", None)
    if roof is None:
        log("measuring memory bandwidth")
        out = subprocess.run([a.python, str(serving.BENCH / "roofline.py"), "bandwidth"], capture_output=True,
                             text=True, check=True).stdout
        roof = json.loads(out)
    weights, note = roofline.weight_bytes_per_token(Path(a.model))
    roof.update(weight_bytes_per_token=weights, weight_bytes_note=note,
                weight_bytes_on_disk=roofline.weight_bytes_on_disk(Path(a.model)),
                kv_bytes_per_token={c: roofline.kv_bytes_per_token(Path(a.model), KV_BITS[c]) for c in CONFIGS},
                quantized_kv_start=0)
    res.save("roofline.json", roof)
    return roof


def main():
    a = parse_args()
    a.started = time.monotonic()
    # A time limit's SIGTERM unwinds like Ctrl-C: the servers are stopped, the results kept.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    a.out = Path(a.out).resolve()
    backend = backend_of(a.python)
    if a.memory_gib is None:
        gpu = gpu_info()
        a.memory_gib = 0.8 * gpu[1] if gpu and backend == "cuda" else 0.5 * ram_gib()
    res = Results(a.out)
    m = meta(a, backend)
    old = res.load("meta.json", None)
    if old and old.get("commit") != m["commit"]:
        sys.exit(f"{a.out} holds results of commit {old.get('commit')}, this binary is {m['commit']}: use another --out")
    roof = roofline_facts(a, res)
    m["harness"]["prompt_cache_bytes"] = prompt_cache_bytes(a, roof)
    res.save("meta.json", m)
    log(f"{m['device']}: {roof['bandwidth_gbs']:.1f} GB/s; {roof['weight_bytes_per_token'] / 1e9:.3f} GB of weights per token")

    work = Path(tempfile.mkdtemp(prefix="suite-"))
    try:
        model = work / "model"
        serving.fixed_length_model(Path(a.model), model)
        tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        cfg = roofline.text_config(json.loads((model / "config.json").read_text()))
        model_ctx = cfg.get("max_position_embeddings")
        for i, config in enumerate(a.configs):
            # Alternate which server goes first, so drift over the run falls on both.
            order = a.servers if i % 2 == 0 else a.servers[::-1]
            for kind in order:
                session(kind, config, a, model, tok, res, roof, model_ctx)
    except OutOfTime:
        log(f"--time-budget {a.time_budget:.0f} s spent; run the same command again to go on")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not a.no_report:
        import report
        report.write_report(a.out)
        log(f"report: {a.out / 'report.md'}")


if __name__ == "__main__":
    main()
