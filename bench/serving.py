"""What the HTTP benchmarks share: a fixed-length copy of a model, prompts of an exact token
count, one server process (start, health, memory high-water marks, stop) and a streaming
client that times each request.

Both servers are read the same way: peak RSS is the kernel's VmHWM after writing 5 to
/proc/PID/clear_refs; MLX's peak memory is reset with SIGUSR1 (mlx-serve handles it; the
reference runs under bench/mlx_lm_probe.py, which adds the same handler to mlx_lm.server) and
read from mlx-serve's /health, or from the probe's file after SIGUSR2.
"""

import asyncio, json, os, random, signal, socket, subprocess, sys, time
from pathlib import Path

try:
    import httpx
except ImportError:  # the reference venv ships httpx under its new name
    import httpx2 as httpx
from tokenizers import Tokenizer

BENCH = Path(__file__).resolve().parent

WORDS = ("the of and to in is was for on that with as by at from his her are an which this be "
         "or have it not were had but they one their all has been model token server memory "
         "cache layer weight attention value key query stream expert quantize metal cuda apple "
         "silicon rust python benchmark hello world").split()


# ---------------------------------------------------------------- model and prompts

def fixed_length_model(src: Path, dst: Path) -> int:
    """Links src's files into dst, with the eos token moved to the last vocab id, so neither
    server stops early (mlx_lm.server has no ignore_eos)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "tokenizer_config.json" and not (dst / f.name).exists():
            (dst / f.name).symlink_to(f.resolve())
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    eos_id = tok.get_vocab_size() - 1
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["eos_token"] = tok.id_to_token(eos_id)
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return eos_id


def make_text(tok: Tokenizer, n_tokens: int, tag: str) -> str:
    """Text of exactly n_tokens tokens (as the tokenizer counts them alone), starting with a
    unique tag so that prompts with different tags share no prefix. Encodes a long enough
    word stream once and cuts it at the n-th token's end (linear, also for 32K tokens)."""
    rng = random.Random(tag)
    words = [f"r{tag}:"]
    text = ""
    while True:
        words += [rng.choice(WORDS) for _ in range(max(64, n_tokens))]
        text = " ".join(words)
        enc = tok.encode(text, add_special_tokens=False)
        if len(enc.ids) > n_tokens:
            break
    cut = text[:enc.offsets[n_tokens - 1][1]] if n_tokens > 0 else ""
    # Cutting can merge differently at the end; trim words until the count fits.
    while len(tok.encode(cut, add_special_tokens=False).ids) > n_tokens:
        cut = cut.rsplit(" ", 1)[0]
    return cut


def chat(user: str, system: str | None = None) -> list:
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": user}]


# ---------------------------------------------------------------- server processes

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# `timeout` ends a bench with SIGTERM: as SystemExit it unwinds through each `finally:
# server.stop()`, so no server outlives the bench holding the GPU's memory for the next command.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


class Server:
    """One server process: start, wait until it answers /health, read its memory, stop.
    `kind` is "ours" (mlx-serve) or "ref" (mlx_lm.server under the memory probe)."""

    def __init__(self, name, kind, argv, env, log_dir):
        self.name, self.kind, self.argv, self.env, self.log_dir = name, kind, argv, env, log_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.memory_file = Path(log_dir) / f"{name}-{self.port}-memory.json"
        self.proc = None

    def start(self, timeout=600):
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        self.log = open(Path(self.log_dir) / f"{self.name}.log", "a")
        env = dict(self.env, MLX_MEMORY_FILE=str(self.memory_file))
        self.proc = subprocess.Popen(self.argv + ["--port", str(self.port)], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}, see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not start in {timeout}s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reset_peaks(self):
        """Starts a new high-water mark for RSS and MLX memory."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        before = self._probe_seq()
        self.proc.send_signal(signal.SIGUSR1)
        if self.kind == "ours":
            time.sleep(0.05)  # a tokio task resets it at once
            return
        # The probe's handler runs when Python's main thread next gets the GIL; it writes the
        # memory file after resetting.
        deadline = time.perf_counter() + 10
        while self._probe_seq() == before and time.perf_counter() < deadline:
            time.sleep(0.01)

    def status_kib(self, field) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        return float("nan")

    def peak_rss_mib(self) -> float:
        return self.status_kib("VmHWM") / 1024

    def rss_mib(self) -> float:
        return self.status_kib("VmRSS") / 1024

    def mlx_memory(self, timeout=10.0) -> dict:
        """{"active_bytes", "peak_bytes"} of MLX's allocator, once the server is idle."""
        deadline = time.perf_counter() + timeout
        if self.kind == "ours":
            while True:  # the engine publishes after its turn; wait until it has none running
                h = httpx.get(self.url + "/health", timeout=10).json()
                if h["engine"]["running"] == 0 or time.perf_counter() > deadline:
                    return {k: h["memory"][k] for k in ("active_bytes", "peak_bytes")}
                time.sleep(0.05)
        before = self._probe_seq()
        self.proc.send_signal(signal.SIGUSR2)
        while time.perf_counter() < deadline:
            if self._probe_seq() != before:
                return json.loads(self.memory_file.read_text())
            time.sleep(0.02)
        return {"active_bytes": None, "peak_bytes": None}

    def _probe_seq(self):
        try:
            return json.loads(self.memory_file.read_text())["seq"]
        except (OSError, ValueError, KeyError):
            return None

    def log_tail(self) -> str:
        """The last error line of the server's log (where mlx_lm.server reports a stream it
        closed), or its last line."""
        self.log.flush()
        lines = [l.strip() for l in Path(self.log.name).read_text(errors="replace").splitlines() if l.strip()]
        errors = [l for l in lines if "Error" in l or "error" in l]
        return (errors or lines or [""])[-1][:300]

    def healthy(self) -> bool:
        """Whether it still generates: one short request."""
        try:
            r = run_wave(self.url, [[{"role": "user", "content": "hi"}]], 2, timeout=120)["requests"][0]
            return request_ok(r)
        except Exception:
            return False

    def stop(self):
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.memory_file.unlink(missing_ok=True)


def ours_argv(binary, model, extra) -> list:
    quiet = [] if "--log-level" in extra else ["--log-level", "warn"]
    return [binary, "--model", str(model)] + quiet + list(extra)


def ref_argv(python, model, extra) -> list:
    return [python, str(BENCH / "mlx_lm_probe.py"), "--model", str(model), "--log-level", "WARNING"] + list(extra)


# ---------------------------------------------------------------- client

async def stream_request(client, url, messages, max_tokens, attempts=3, extra=None) -> dict:
    """One streaming chat completion (with the `extra` body fields); times the first and
    last content chunk. A connection dropped before any response byte is retried (as the
    openai client does), from the same start time; the retries are counted."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}, **(extra or {})}
    t0 = time.perf_counter()
    first = last = usage = status = None
    error = None
    times = []  # arrival of each content chunk
    retries = 0
    while status is None:
        try:
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                status = r.status_code
                if status != 200:
                    error = (await r.aread()).decode(errors="replace")[:300]
                    break
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("error"):  # a stream that failed after it started
                        error = str(chunk["error"].get("message", chunk["error"]))[:300]
                    usage = chunk.get("usage") or usage
                    choices = chunk.get("choices") or []
                    if choices and (choices[0].get("delta") or {}).get("content"):
                        last = time.perf_counter()
                        first = first or last
                        times.append(last)
        except httpx.TransportError as e:
            if status is not None or retries + 1 >= attempts:
                status = f"{status} then {type(e).__name__}" if status else type(e).__name__
                break
            retries += 1
    end = time.perf_counter()
    n = (usage or {}).get("completion_tokens", 0)
    return {"status": status, "error": error, "retries": retries, "start": t0, "end": end,
            "first": first, "last": last, "times": times, "ttft_s": (first or end) - t0,
            "decode_tps": (n - 1) / (last - first) if first and last > first else None,
            "e2e_s": end - t0, "prompt_tokens": (usage or {}).get("prompt_tokens"),
            "completion_tokens": n, "max_tokens": max_tokens,
            "cached_tokens": ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")}


def steady_decode_tps(reqs) -> float | None:
    """Aggregate decode tok/s while every stream is decoding: tokens that arrived between the
    last stream's first token and the first stream's last token, over that window. Outside
    it some streams are still prefilling or already done, which is not what the roofline
    (all c streams decoding) describes. None when the streams never all decoded at once."""
    if not reqs or any(not r["times"] for r in reqs):
        return None
    start, end = max(r["times"][0] for r in reqs), min(r["times"][-1] for r in reqs)
    if end <= start:
        return None
    # Tokens after `start` up to `end`: the chunk at `start` only opens the window.
    n = sum(sum(1 for t in r["times"] if start < t <= end) for r in reqs)
    return n / (end - start) if n >= 2 * len(reqs) else None


def request_ok(r) -> bool:
    return r["status"] == 200 and r["completion_tokens"] == r["max_tokens"]


def client_for(n_requests, timeout=1800.0):
    """An async client with a connection for each of `n_requests` concurrent requests."""
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=httpx.Limits(max_connections=n_requests + 4))


async def wave(url, message_lists, max_tokens, timeout=1800.0, extra=None) -> dict:
    """All requests at once; aggregate tok/s over the wave's wall time."""
    async with client_for(len(message_lists), timeout) as client:
        reqs = await asyncio.gather(*(stream_request(client, url, m, max_tokens, extra=extra) for m in message_lists))
    wall = max(r["end"] for r in reqs) - min(r["start"] for r in reqs)
    return {"requests": reqs, "wall_s": wall,
            "aggregate_tps": sum(r["completion_tokens"] for r in reqs) / wall}


def run_wave(url, message_lists, max_tokens, timeout=1800.0, extra=None):
    return asyncio.run(wave(url, message_lists, max_tokens, timeout, extra))


def python_versions(python) -> list:
    """[mlx-lm version, MLX version] of the reference's Python."""
    out = subprocess.run([python, "-c", "import mlx_lm, mlx.core as mx; print(mlx_lm.__version__, mx.__version__)"],
                         capture_output=True, text=True).stdout.split()
    return out + ["?"] * (2 - len(out))


def ours_env(binary, python) -> dict:
    """mlx-serve's environment: the reference's libmlx.so when none sits beside the binary, so
    both servers run the same MLX build."""
    env = dict(os.environ)
    if not (Path(binary).parent / "libmlx.so").exists():
        lib = subprocess.run([python, "-c", "import mlx, os; print(os.path.join(mlx.__path__[0], 'lib'))"],
                             capture_output=True, text=True).stdout.strip()
        if lib:
            env["LD_LIBRARY_PATH"] = lib + ":" + env.get("LD_LIBRARY_PATH", "")
    return env


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
