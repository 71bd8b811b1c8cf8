"""Server start on a GPU, one process after another: how long each start takes until /health
answers, then the first request's time to first token, and (mlx-serve) where its CUDA custom
kernels came from (`mlx_serve_cuda_kernels` of /metrics: MLX's kernel cache, compiled and
kept there, compiled by MLX alone). Compile-once shows as later starts that load every
kernel from the cache instead of compiling it; --off adds a last mlx-serve start as every
process started before compile-once: MLX_SERVE_KERNEL_CACHE=0, with a copy of the cache folder
that holds MLX's own kernels but none of ours (MLX reads custom kernels from that folder, so
with ours there even a start with compile-once off would load them).

Every start uses the kernel cache folder --ptx-dir (MLX_PTX_CACHE_DIR); --fresh empties it
first, so the first start compiles everything (MLX's own kernels as well as ours). With
--python, mlx_lm.server starts the same way after mlx-serve (same folder; it compiles MLX's
kernels at its first request, which its TTFT then includes).

usage: python bench/start_probe.py --model DIR --mlx-serve BIN [--flags "--turbo-kv balanced"]
           [--starts 3] [--off] [--ptx-dir DIR] [--fresh] [--python PY] [--prompt-tokens 256]
"""

import argparse, asyncio, os, re, shutil, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serving
from serving import Server
from tokenizers import Tokenizer


def kernel_sources(url) -> dict:
    """mlx_serve_cuda_kernels by source, from /metrics ({} when none are reported)."""
    text = serving.httpx.get(url + "/metrics", timeout=10).text
    return {m[1]: int(float(m[2])) for m in re.finditer(r'^mlx_serve_cuda_kernels\{source="(\w+)"\} (\S+)$', text, re.M)}


def cache_files(folder: Path) -> int:
    return sum(1 for _ in folder.rglob("*.ptx")) if folder.exists() else 0


def one_start(name, kind, argv, env, work, prompt) -> dict:
    server = Server(name, kind, argv, env, work)
    try:
        ready = server.start(timeout=900)
        async def first():
            async with serving.httpx.AsyncClient(timeout=900) as client:
                return await serving.stream_request(client, server.url, serving.chat(prompt), 8)
        r = asyncio.run(first())
        kernels = kernel_sources(server.url) if kind == "ours" else {}
        return {"ready_s": ready, "ttft_s": r["ttft_s"], "ok": serving.request_ok(r), "kernels": kernels}
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-serve", required=True)
    ap.add_argument("--flags", default="", help="mlx-serve's extra flags")
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--ptx-dir", default=str(Path.home() / ".cache" / "mlx-ptx-probe"))
    ap.add_argument("--fresh", action="store_true", help="empty --ptx-dir first")
    ap.add_argument("--off", action="store_true", help="one more mlx-serve start with compile-once off")
    ap.add_argument("--python", help="a Python with mlx-lm: mlx_lm.server starts as well")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    a = ap.parse_args()
    if a.starts < 1 or a.prompt_tokens < 1:
        ap.error("--starts and --prompt-tokens must be at least 1")
    ptx = Path(a.ptx_dir)
    if a.fresh:
        shutil.rmtree(ptx, ignore_errors=True)
    work = tempfile.mkdtemp(prefix="start-probe-")
    model = Path(work) / "model"
    serving.fixed_length_model(Path(a.model), model)
    prompt = serving.make_text(Tokenizer.from_file(str(model / "tokenizer.json")), a.prompt_tokens, "start")
    env = dict(serving.ours_env(a.mlx_serve, a.python or sys.executable), MLX_PTX_CACHE_DIR=str(ptx))
    ours = serving.ours_argv(a.mlx_serve, model, ["--log-level", "info"] + a.flags.split())
    # (the table's name, its logs' name, kind, argv, environment, starts)
    runs = [("mlx-serve", "mlx-serve", "ours", ours, env, a.starts)]
    if a.off:
        without_ours = Path(work) / "ptx-without-ours"
        runs.append(("mlx-serve, compile-once off", "mlx-serve-off", "ours", ours, dict(env, MLX_SERVE_KERNEL_CACHE="0", MLX_PTX_CACHE_DIR=str(without_ours)), 1))
    if a.python:
        runs.append(("mlx_lm.server", "mlx_lm.server", "ref", serving.ref_argv(a.python, model, []), env, a.starts))
    print(f"| server | start | cache files before | ready s | first request TTFT s | ok | CUDA kernels: cache / compiled, kept / compiled by MLX |")
    print("|---|---|---|---|---|---|---|")
    for name, log_name, kind, argv, run_env, starts in runs:
        folder = Path(run_env["MLX_PTX_CACHE_DIR"])
        if folder != ptx:  # the folder as it is now, less our kernels' modules
            shutil.copytree(ptx, folder, ignore=lambda _, names: [n for n in names if n.startswith("custom_kernel_")])
        for i in range(starts):
            before = cache_files(folder)
            r = one_start(f"{log_name}-{i}", kind, argv, run_env, work, prompt)
            k = r["kernels"]
            shown = f"{k.get('cache', 0)} / {k.get('compiled_kept', 0)} / {k.get('compiled_by_mlx', 0)}" if k else "—"
            print(f"| {name} | {i + 1} | {before} | {r['ready_s']:.1f} | {r['ttft_s']:.2f} | {r['ok']} | {shown} |", flush=True)
    print(f"logs: {work}")


if __name__ == "__main__":
    main()
