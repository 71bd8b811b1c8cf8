"""What serving over a distributed group costs per decode step: one model served by one
mlx-serve process, then by N ranks on this machine over MLX's ring backend (tensor and
pipeline modes), the same requests to each, one configuration at a time.

On one machine the ranks split its cores rather than add any, so this does not show scaling
(that needs several machines or GPUs): it shows the group's overhead, the collectives and
the turn each rank receives from rank 0 before every step.

Per configuration and concurrency C: C completions at once (ignore_eos, fixed length), after
an untimed warm-up of the same shape. Reported: aggregate tok/s of the wave, and the mean
time between tokens of a sequence (the decode step: mlx_serve_inter_token_seconds from
/metrics, its sum and count before and after the wave).

usage: vendor/pyref/bin/python bench/distributed_bench.py --model DIR --mlx-serve PATH
           [--ranks 2] [--modes single,tensor,pipeline,pipeline-gather] [--concurrency 1,8]
           [--prompt-tokens 64] [--gen-tokens 64] [--out bench/results/distributed.json]
"""

import argparse, json, os, platform, socket, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    import httpx
except ImportError:  # the reference venv ships httpx under its new name
    import httpx2 as httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Group:
    """Rank 0 (serving HTTP on a free port) and ranks 1..n-1, or one plain process."""

    def __init__(self, binary, model, ranks, mode, log_dir):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs = []
        flags = ["--model", model, "--log-level", "warn"]
        env = dict(os.environ)
        if mode != "single":
            hostfile = Path(log_dir) / "hosts.json"
            hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(ranks)]))
            env["MLX_HOSTFILE"] = str(hostfile)
            # "pipeline-gather": stages hand on by all-gathers, as over NCCL.
            flags += ["--distributed", mode.split("-")[0]]
            if mode == "pipeline-gather":
                flags += ["--pipeline-transfer", "gather"]
        for rank in reversed(range(ranks if mode != "single" else 1)):
            e = dict(env, MLX_RANK=str(rank)) if mode != "single" else env
            port = str(self.port) if rank == 0 else "0"
            log = open(Path(log_dir) / f"{mode}-rank{rank}.log", "w")
            self.procs.append(subprocess.Popen([binary, *flags, "--port", port], env=e, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + 300
        while time.time() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"{mode}: a rank exited, see {log_dir}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{mode}: no answer within 300 s")

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def wave(url, concurrency, prompt, gen_tokens):
    body = {"prompt": prompt, "max_tokens": gen_tokens, "ignore_eos": True, "temperature": 0}
    before = httpx.get(url + "/metrics").text
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda _: httpx.post(url + "/v1/completions", json=body, timeout=1800), range(concurrency)))
    wall = time.perf_counter() - t0
    after = httpx.get(url + "/metrics").text
    for r in replies:
        r.raise_for_status()
        assert r.json()["usage"]["completion_tokens"] == gen_tokens, r.text
    name = "mlx_serve_inter_token_seconds"
    steps = metric(after, name + "_count") - metric(before, name + "_count")
    step_s = (metric(after, name + "_sum") - metric(before, name + "_sum")) / max(steps, 1)
    return {"tok_s": concurrency * gen_tokens / wall, "step_ms": step_s * 1000, "wall_s": wall,
            "text": replies[0].json()["choices"][0]["text"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-serve", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--modes", default="single,tensor,pipeline,pipeline-gather")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="bench/results/distributed.json")
    args = ap.parse_args()
    prompt = " ".join(["the model"] * (args.prompt_tokens // 2))
    levels = [int(c) for c in args.concurrency.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        for mode in args.modes.split(","):
            group = Group(args.mlx_serve, args.model, args.ranks, mode, logs)
            try:
                for c in levels:
                    wave(group.url, c, prompt, min(args.gen_tokens, 8))  # warm-up: the same shapes
                    r = wave(group.url, c, prompt, args.gen_tokens)
                    r.update(mode=mode, ranks=1 if mode == "single" else args.ranks, concurrency=c)
                    rows.append(r)
                    print(f"{mode:15} ranks {r['ranks']} C={c:2}: {r['tok_s']:8.1f} tok/s, {r['step_ms']:7.2f} ms per step", flush=True)
            finally:
                group.stop()
    base = {r["concurrency"]: r for r in rows if r["mode"] == "single"}
    for r in rows:
        b = base.get(r["concurrency"])
        if b and r["mode"] != "single":
            r["step_ms_over_single"] = r["step_ms"] - b["step_ms"]
            r["same_text_as_single"] = r["text"] == b["text"]
    result = {"model": args.model, "machine": f"{platform.machine()}, {os.cpu_count()} cores", "label": args.label,
              "date": time.strftime("%Y-%m-%d"), "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("| mode | ranks | concurrency | tok/s | ms per step | vs one process | same text |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        over = f"{r['step_ms_over_single']:+.2f} ms" if "step_ms_over_single" in r else "—"
        same = {True: "yes", False: "no"}.get(r.get("same_text_as_single"), "—")
        print(f"| {r['mode']} | {r['ranks']} | {r['concurrency']} | {r['tok_s']:.1f} | {r['step_ms']:.2f} | {over} | {same} |")


if __name__ == "__main__":
    sys.exit(main())
