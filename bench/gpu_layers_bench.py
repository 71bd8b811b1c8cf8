#!/usr/bin/env python3
"""--gpu-layers and the memory plan on a GPU: for each setting, start mlx-serve,
take one greedy completion (token ids), its decode speed, the GPU memory the
process holds (nvidia-smi) and the plan /health reports. Prints a table and
writes JSON.

  python3 bench/gpu_layers_bench.py --model DIR --mlx-serve BIN \
      --setting all= --setting 8=--gpu-layers,8 --setting plan3g=--memory-budget,3g
"""
import argparse, json, subprocess, time, urllib.request, signal, threading


def post(base, path, body, stream=False):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def gpu_used_mib():
    """GPU memory in use on the whole card. (MLX's CUDA buffers are managed
    memory: the per-process figure leaves them out, the card's total counts
    the pages resident on the GPU.)"""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


def run(binary, model, flags, prompt, tokens):
    idle_gpu = gpu_used_mib()
    proc = subprocess.Popen([binary, "--model", model, "--port", "0", "--log-level", "warn"] + flags,
                            stderr=subprocess.PIPE, text=True)
    base = None
    log = []
    while base is None:
        line = proc.stderr.readline()
        if not line:
            raise SystemExit("server exited:\n" + "".join(log))
        log.append(line)
        if line.startswith("mlx-serve: listening on "):
            base = line.split("listening on ")[1].strip()
    # Keep draining the server's log so its pipe never fills.
    threading.Thread(target=lambda: [log.append(l) for l in proc.stderr], daemon=True).start()
    try:
        body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "logprobs": 1}
        post(base, "/v1/completions", dict(body, max_tokens=8)).read()  # warm-up (kernels compile)
        t0 = time.time()
        r = json.load(post(base, "/v1/completions", body))
        wall = time.time() - t0
        # Decode speed from a stream: time from the first token to the last.
        times = []
        with post(base, "/v1/completions", dict(body, stream=True, logprobs=None)) as s:
            for raw in s:
                if raw.startswith(b"data: {"):
                    times.append(time.time())
        decode_tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 2 else None
        health = json.load(urllib.request.urlopen(base + "/health"))
        return {
            "flags": flags,
            "token_ids": r["choices"][0]["logprobs"]["tokens"],
            "text": r["choices"][0]["text"],
            "wall_s": wall,
            "decode_tok_s": decode_tps,
            "gpu_mib": gpu_used_mib() - idle_gpu,
            "mlx_active_bytes": health["memory"]["active_bytes"],
            "memory_plan": health["memory_plan"],
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-serve", required=True)
    ap.add_argument("--setting", action="append", required=True, help="NAME=flag,flag,...")
    ap.add_argument("--prompt", default="The history of the printing press begins")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out")
    a = ap.parse_args()
    results = {}
    for s in a.setting:
        name, _, flags = s.partition("=")
        t0 = time.time()
        results[name] = run(a.mlx_serve, a.model, [f for f in flags.split(",") if f], a.prompt, a.tokens)
        r = results[name]
        print(f"{name}: {time.time() - t0:.0f} s, decode {r['decode_tok_s']} tok/s, GPU {r['gpu_mib']} MiB, ids {r['token_ids'][:8]}...", flush=True)
    ref = next(iter(results.values()))["token_ids"]
    print(f"{'setting':<10} {'gpu layers':>10} {'same tokens':>12} {'first diff':>10} {'decode tok/s':>12} {'GPU MiB':>8} {'plan budget GiB':>15} {'kv':>14} {'context':>8}")
    for name, r in results.items():
        ids = r["token_ids"]
        diff = next((i for i, (x, y) in enumerate(zip(ids, ref)) if x != y), None)
        p = r["memory_plan"]
        r["same_tokens_as_first"] = ids == ref
        print(f"{name:<10} {str(p['gpu_layers'] if p['gpu_layers'] is not None else 'all'):>10} {str(ids == ref):>12} {str(diff):>10} "
              f"{(r['decode_tok_s'] or 0):>12.1f} {r['gpu_mib']:>8} {p['budget_bytes'] / 2**30:>15.2f} {p['kv_format']:>14} {p['context']:>8}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
