"""One model served on one GPU and over several (tensor and pipeline parallel), by mlx-serve and
by mlx_lm.server's distributed mode, one configuration at a time, the same requests to each.

A configuration is SERVER:MODE, SERVER `ours` (mlx-serve) or `ref` (mlx_lm.server under
bench/mlx_lm_probe.py), MODE `1` (one process, one GPU), `tensor` or `pipeline` (one process a
GPU). Ranks find each other through NCCL's environment, as `mlx.launch --backend nccl` sets it
(MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT, one GPU a rank through CUDA_VISIBLE_DEVICES), or, with
`--backend ring` (for a try on a CPU machine), through a hostfile.

Per configuration, after an untimed warm-up of every timed shape:
  same text  --texts prompts, greedy, --text-tokens each, one request at a time; every
             configuration's answers are compared with its own server's one-GPU answers (char
             position of the first difference). The two servers' texts are not compared: their
             detokenizers differ at the edges (mlx_lm.server drops a leading space and holds back
             a partial last token); the parity suite compares their tokens.
  decode     one stream of --gen-tokens (tok/s after its first token, best of 2), then
             --streams streams at once (aggregate tok/s of the wave, and while all decode).
  TTFT       a --ttft-tokens prompt, a new one each time (nothing cached), median of --ttft-reps.
  memory     GPU memory in use on each GPU (nvidia-smi) after the runs.

Both servers load a copy of the model whose eos token is the last (unused) vocabulary entry,
so every request generates its full length (mlx_lm.server has no ignore_eos).

usage: python bench/multi_gpu_bench.py --model DIR --mlx-serve PATH [--python PY] [--gpus 2]
           [--configs ours:1,ours:tensor,ours:pipeline,ref:1,ref:tensor,ref:pipeline]
           [--backend nccl|ring] [--out bench/results/multi-gpu.json]
"""

import argparse, json, os, platform, statistics, subprocess, sys, tempfile, time
from pathlib import Path

from tokenizers import Tokenizer

import serving
from serving import chat, fixed_length_model, free_port, log, make_text, ours_argv, ours_env, ref_argv, run_wave

httpx = serving.httpx


class Group:
    """The processes of one configuration; rank 0 answers HTTP."""

    def __init__(self, config, a, model, log_dir):
        self.server, self.mode = config.split(":")
        self.ranks = 1 if self.mode == "1" else a.gpus
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logs = [Path(log_dir) / f"{self.server}-{self.mode}-rank{r}.log" for r in range(self.ranks)]
        base = ours_env(a.mlx_serve, a.python) if self.server == "ours" else dict(os.environ)
        base["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off on shared hosts
        if self.ranks > 1:
            if a.backend == "nccl":
                base.update(MLX_WORLD_SIZE=str(self.ranks), NCCL_HOST_IP="127.0.0.1", NCCL_PORT=str(free_port()))
            else:
                hostfile = Path(log_dir) / f"hosts-{self.server}-{self.mode}.json"
                hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(self.ranks)]))
                base["MLX_HOSTFILE"] = str(hostfile)
        if self.server == "ours":
            extra = ["--distributed", self.mode, "--distributed-backend", a.backend] if self.ranks > 1 else []
            argv = ours_argv(a.mlx_serve, model, extra)
        else:
            argv = ref_argv(a.python, model, ["--pipeline"] if self.mode == "pipeline" else [])
        self.procs = []
        for r in reversed(range(self.ranks)):
            env = dict(base, MLX_MEMORY_FILE=str(Path(log_dir) / "memory.json"))
            if self.ranks > 1:
                env["MLX_RANK"] = str(r)
            if a.backend == "nccl":
                env["CUDA_VISIBLE_DEVICES"] = str(r)
            # mlx-serve's other ranks serve no HTTP (port 0); mlx_lm.server's never bind theirs.
            port = self.port if r == 0 or self.server == "ref" else 0
            self.procs.append(subprocess.Popen(argv + ["--port", str(port)], env=env,
                                               stdout=open(self.logs[r], "w"), stderr=subprocess.STDOUT))
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < a.start_timeout:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a rank exited: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.startup_s = time.perf_counter() - t0
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"no answer in {a.start_timeout} s: {self.log_tail()}")

    def log_tail(self) -> str:
        lines = []
        for path in self.logs:
            text = [l.strip() for l in path.read_text(errors="replace").splitlines() if l.strip()] if path.exists() else []
            errors = [l for l in text if "rror" in l or "panic" in l or "Exception" in l]
            lines.append(f"{path.name}: " + ((errors or text or [""])[-1])[:300])
        return " | ".join(lines)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def complete(url, prompt, max_tokens) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def gpu_memory_mib() -> list:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return [int(x) for x in out.split()]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


def measure(g, tok, a, texts) -> dict:
    decode_prompt = lambda tag: [chat(make_text(tok, a.prompt_tokens, tag))]
    # Warm-up: every timed shape once (CUDA kernels are compiled at first use).
    run_wave(g.url, decode_prompt("warm-1"), 16)
    run_wave(g.url, [decode_prompt(f"warm-{i}")[0] for i in range(a.streams)], 8)
    run_wave(g.url, [chat(make_text(tok, a.ttft_tokens, "warm-ttft"))], 1)
    complete(g.url, texts[0], 4)
    out = {"startup_s": g.startup_s}
    out["texts"] = [complete(g.url, t, a.text_tokens) for t in texts]
    one = [run_wave(g.url, decode_prompt(f"one-{k}"), a.gen_tokens)["requests"][0] for k in range(2)]
    for r in one:
        assert r["completion_tokens"] == a.gen_tokens, r
    out["decode_tps_1"] = max(r["decode_tps"] for r in one)
    w = run_wave(g.url, [decode_prompt(f"many-{i}")[0] for i in range(a.streams)], a.gen_tokens)
    assert all(r["completion_tokens"] == a.gen_tokens for r in w["requests"]), [r["error"] for r in w["requests"]]
    out["aggregate_tps_n"] = w["aggregate_tps"]
    out["steady_tps_n"] = serving.steady_decode_tps(w["requests"])
    ttft = [run_wave(g.url, [chat(make_text(tok, a.ttft_tokens, f"ttft-{k}"))], 1)["requests"][0]["ttft_s"]
            for k in range(a.ttft_reps)]
    out["ttft_s"] = statistics.median(ttft)
    out["ttft_all_s"] = ttft
    out["gpu_memory_mib"] = gpu_memory_mib()
    return out


def first_difference(x: str, y: str):
    for i, (p, q) in enumerate(zip(x, y)):
        if p != q:
            return i
    return None if len(x) == len(y) else min(len(x), len(y))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-serve", required=True)
    ap.add_argument("--python", default=sys.executable, help="Python with mlx and mlx-lm, for mlx_lm.server")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "ring"])
    ap.add_argument("--configs", default="ours:1,ours:tensor,ours:pipeline,ref:1,ref:tensor,ref:pipeline")
    ap.add_argument("--texts", type=int, default=4)
    ap.add_argument("--text-tokens", type=int, default=48)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--ttft-tokens", type=int, default=4096)
    ap.add_argument("--ttft-reps", type=int, default=3)
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="bench/results/multi-gpu.json")
    a = ap.parse_args()
    a.mlx_serve = str(Path(a.mlx_serve).resolve())
    tok = Tokenizer.from_file(str(Path(a.model) / "tokenizer.json"))
    texts = [make_text(tok, 32, f"text-{i}") for i in range(a.texts)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        fixed_length_model(Path(a.model).resolve(), model)
        for config in a.configs.split(","):
            log(f"{config}: starting")
            row = {"config": config}
            g = None
            try:
                g = Group(config, a, model, tmp)
                row.update(measure(g, tok, a, texts))
                log(f"{config}: {row['decode_tps_1']:.1f} tok/s one stream, {row['aggregate_tps_n']:.1f} tok/s "
                    f"{a.streams} streams, TTFT {row['ttft_s'] * 1000:.0f} ms, GPU MiB {row['gpu_memory_mib']}")
            except Exception as e:  # a configuration that does not run is a result too
                row["error"] = f"{type(e).__name__}: {e}"[:600]
                if g is not None and "error" in row and "rank exited" not in row["error"]:
                    row["error"] += " | " + g.log_tail()
                log(f"{config}: failed: {row['error']}")
            finally:
                if g is not None:
                    g.stop()
            rows.append(row)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out + ".partial").write_text(json.dumps(rows, indent=1))  # kept if the run is cut short
    by = {r["config"]: r for r in rows if "texts" in r}
    for r in rows:
        if "texts" not in r:
            continue
        base = r["config"].split(":")[0] + ":1"
        if base in by and base != r["config"]:
            r["vs_one_gpu"] = [first_difference(x, y) for x, y in zip(r["texts"], by[base]["texts"])]
    machine = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip().replace("\n", ", ") if a.backend == "nccl" else ""
    result = {"model": a.model, "machine": machine or f"{platform.machine()}, {os.cpu_count()} cores",
              "label": a.label, "date": time.strftime("%Y-%m-%d"), "backend": a.backend, "gpus": a.gpus,
              "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens, "streams": a.streams,
              "ttft_tokens": a.ttft_tokens, "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    Path(a.out + ".partial").unlink(missing_ok=True)
    same = lambda d: "—" if d is None else ("yes" if all(x is None for x in d) else
                                            "no (first difference at char " + ", ".join("-" if x is None else str(x) for x in d) + ")")
    print(f"| server | mode | decode tok/s, 1 stream | {a.streams} streams, aggregate (all decoding) | "
          f"TTFT {a.ttft_tokens} tokens | GPU MiB | same text as its 1 GPU |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        server, mode = r["config"].split(":")
        name = {"ours": "mlx-serve", "ref": "mlx_lm.server"}[server]
        mode = {"1": "1 GPU"}.get(mode, f"{mode}, {a.gpus} GPUs")
        if "error" in r:
            print(f"| {name} | {mode} | failed: {r['error'][:200]} | | | | |")
            continue
        steady = f" ({r['steady_tps_n']:.1f})" if r["steady_tps_n"] else ""
        print(f"| {name} | {mode} | {r['decode_tps_1']:.1f} | {r['aggregate_tps_n']:.1f}{steady} | "
              f"{r['ttft_s'] * 1000:.0f} ms | {'+'.join(map(str, r['gpu_memory_mib']))} | "
              f"{same(r.get('vs_one_gpu'))} |")


if __name__ == "__main__":
    sys.exit(main())
