"""Expert streaming benchmark: decode and prefill of one MoE model with every
routed expert resident, then streamed from disk at several cache budgets, in one
run on one machine; plus the disk itself (O_DIRECT reads of one expert's size).

usage: python expert_bench.py --model DIR --bin mlx-serve [--runs resident,100%,75%,50%,25%,25%-noahead,25%-nospec]
       [--prompt-kind words|random]
       [--prompt-tokens 2048] [--gen-tokens 128] [--temp 0.8] [--out results.json]

Every run samples with the same seed: equal logits give equal tokens, so each
streamed run must print the resident run's token ids (checked, reported as
"same tokens"). Random-weight models route almost uniformly, so hit rates here
are close to the cache's share of experts: a floor for real models, whose
routing repeats from token to token.
"""

import argparse
import json
import mmap
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

WORDS = "the model token server memory cache layer weight attention value key query stream".split()


def prompt_text(model, n_tokens, kind="words"):
    """A prompt of about `n_tokens` tokens: repeated English words, or ("random")
    random vocabulary entries, which a random-weight router spreads over all
    experts, as a trained model's router does with real text."""
    import random as rnd
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    if kind == "random":
        r = rnd.Random(0)
        pieces = []
        while len(tok.encode("".join(pieces)).ids) < n_tokens:
            pieces.append(tok.decode([r.randrange(tok.get_vocab_size())]))
        return "".join(pieces)
    words, i = [], 0
    while len(tok.encode(" ".join(words)).ids) < n_tokens:
        words.extend(WORDS[(i * 7 + j) % len(WORDS)] for j in range(16))
        i += 1
    return " ".join(words)


def expert_bytes(model):
    c = json.loads((Path(model) / "config.json").read_text())
    h, m, q = c["hidden_size"], c["moe_intermediate_size"], c["quantization"]
    per = lambda rows, cols: rows * cols * q["bits"] // 8 + 2 * rows * (cols // q["group_size"]) * 2
    return 2 * per(m, h) + per(h, m), c


def probe_disk(model, size, depths, seconds=3.0):
    """GB/s of O_DIRECT reads of `size` bytes (4 KiB-aligned) at random offsets of
    the model's shards, with `depth` threads each reading one at a time."""
    files = sorted(Path(model).glob("*.safetensors"))
    size = (size + 4095) // 4096 * 4096
    out = {}
    for depth in depths:
        done, stop = [0] * depth, time.time() + seconds

        def worker(k):
            buf = mmap.mmap(-1, size)
            fds = [os.open(f, os.O_RDONLY | os.O_DIRECT) for f in files]
            lens = [os.fstat(fd).st_size for fd in fds]
            rng = random.Random(k)
            while time.time() < stop:
                i = rng.randrange(len(fds))
                off = rng.randrange(0, max(1, lens[i] - size)) // 4096 * 4096
                done[k] += os.preadv(fds[i], [buf], off)
            for fd in fds:
                os.close(fd)

        t0 = time.time()
        ts = [threading.Thread(target=worker, args=(k,)) for k in range(depth)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out[depth] = sum(done) / (time.time() - t0) / 1e9
    return out


def run(binary, model, prompt, gen, temp, prefill, budget, readers):
    cmd = [binary, "generate", "--model", model, "--prompt", prompt, "--max-tokens", str(gen), "--ignore-chat-template",
           "--ignore-eos", "--temp", str(temp), "--seed", "1", "--prefill-size", str(prefill), "--json", "--logprobs", "2"]
    if budget == "resident":
        # Warmed up (the whole generation once, untimed). Unwarmed, the resident weights are
        # read from the files and first touched by the GPU inside the timed prefill (CUDA
        # managed memory migrates on first touch): session 40's resident A3B prefill read
        # 85.5 tok/s, warmed it ran at 1257 (session 41), and its peak never held the
        # weights and a chunk's temporaries at once. Streamed runs start cold: their reads
        # are what they measure.
        cmd.append("--warmup")
    else:
        # "25%-noahead": the same budget without prefill read-ahead; "-nospec" /
        # "-spec": decode steps without / with speculation (default: auto);
        # "-pfN": decode steps read up to N guessed experts ahead (--expert-prefetch N;
        # the server's default is 8, so "-pf0" turns it off).
        share, *options = budget.split("-")
        cmd += ["--stream-experts", "--expert-cache-bytes", share, "--expert-readers", str(readers)]
        flags = {"noahead": ["--no-expert-read-ahead"], "nospec": ["--expert-speculation", "off"], "spec": ["--expert-speculation", "on"]}
        for o in options:
            cmd += ["--expert-prefetch", o[2:]] if o.startswith("pf") else flags[o]
    t0 = time.time()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    # The server's own log (warnings; chunk timings under MLX_SERVE_LOG_LEVEL=debug).
    sys.stderr.write(out.stderr)
    r = json.loads(out.stdout)
    r["wall_s"] = time.time() - t0
    return r


def compare(run, base):
    """Where two runs' tokens part and how far apart their logits were: the
    largest difference of the chosen tokens' log-probabilities before that
    step, and at it the base run's margin between its token and the run's
    (a near-tie when tiny). MLX's CUDA build is not run-to-run deterministic,
    so compare these with two resident runs' own."""
    a, b = run["generated_logprobs"], base["generated_logprobs"]
    part = next((i for i, (x, y) in enumerate(zip(a, b)) if x["token"] != y["token"]), None)
    upto = len(a) if part is None else part
    out = {"parts_at": part, "max_logprob_diff_before": max((abs(x["logprob"] - y["logprob"]) for x, y in zip(a[:upto], b[:upto])), default=0.0)}
    if part is not None:
        theirs = dict((t, lp) for t, lp in b[part]["top"])
        mine = a[part]["token"]
        out["margin_at_part"] = b[part]["logprob"] - theirs[mine] if mine in theirs else None
    return out


def serial_bound(resident_tps, mb_per_token, disk_gbps):
    """Decode tok/s if each token took the resident step plus reading its bytes at the
    disk's bandwidth, one after the other."""
    return 1 / (1 / resident_tps + mb_per_token / 1e3 / disk_gbps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--runs", default="resident,100%,75%,50%,25%")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--prompt-kind", choices=["words", "random"], default="words")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--prefill-size", type=int, default=2048)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--no-probe", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    eb, cfg = expert_bytes(a.model)
    per_token = cfg["num_hidden_layers"] * cfg["num_experts_per_tok"] * eb
    print(f"model {a.model}: {cfg['num_hidden_layers']} layers x {cfg['num_experts']} experts of {eb} bytes "
          f"({cfg['num_hidden_layers'] * cfg['num_experts'] * eb / 1e9:.2f} GB), {per_token / 1e9:.3f} GB of experts per token")
    disk = {} if a.no_probe else probe_disk(a.model, eb, [1, 4, 8, 16])
    for d, bw in disk.items():
        print(f"disk: O_DIRECT {eb} B reads at depth {d}: {bw:.2f} GB/s")
    bw = disk.get(a.readers) or (max(disk.values()) if disk else None)
    prompt = prompt_text(a.model, a.prompt_tokens, a.prompt_kind)
    rows, resident = [], None
    for budget in a.runs.split(","):
        r = run(a.bin, a.model, prompt, a.gen_tokens, a.temp, a.prefill_size, budget, a.readers)
        row = {"run": budget, "prompt_tokens": r["prompt_tokens"], "prompt_tps": r["prompt_tps"],
               "decode_tps": r["generation_tps"], "peak_gb": r["peak_memory_bytes"] / 1e9, "wall_s": r["wall_s"],
               "ids": r["generated_token_ids"]}
        if budget == "resident":
            if resident:
                row["same_tokens"] = row["ids"] == resident["ids"]
            resident = resident or row
        e = r.get("experts")
        if e:
            p, z = e["after_prefill"], e["at_end"]
            prefill_s = r["prompt_tokens"] / r["prompt_tps"]
            hits, misses = z["hits"] - p["hits"], z["misses"] - p["misses"]
            dec_bytes = z["bytes_read"] - p["bytes_read"]
            row.update(hit=hits / max(1, hits + misses), decode_mb_per_token=dec_bytes / len(r["generated_token_ids"]) / 1e6,
                       prefill_gb_read=p["bytes_read"] / 1e9,
                       prefill_read_gbps=p["bytes_read"] / 1e9 / (r["prompt_tokens"] / r["prompt_tps"]),
                       read_ahead=p.get("prefetch_issued", 0), read_ahead_used=p.get("prefetch_used", 0),
                       stall_s=z["stall_seconds"],
                       # Where prefill's time went: the model waiting for reads (stall) and for
                       # its routers' choice (the compute queued before it); the readers' time
                       # in read calls and making arrays, summed over reader threads.
                       prefill_s=prefill_s, prefill_stall_s=p["stall_seconds"],
                       prefill_router_wait_s=p.get("router_wait_seconds"), prefill_read_call_s=p.get("read_call_seconds"),
                       prefill_array_s=p.get("array_seconds"),
                       # The rest: the other layers, the engine between chunks (each chunk's
                       # end waits for its cache and clears MLX's buffer cache).
                       prefill_other_s=prefill_s - p["stall_seconds"] - p.get("router_wait_seconds", 0.0),
                       syncs=z["host_syncs"], decode_syncs=z["host_syncs"] - p["host_syncs"],
                       speculative_steps=z.get("speculative_steps", 0) - p.get("speculative_steps", 0),
                       replayed_steps=z.get("replayed_steps", 0) - p.get("replayed_steps", 0),
                       # Decode's waits for its routers' choices (the device work queued
                       # before each), and the share of read bytes kept on the host for the
                       # GPU to read in place (CUDA managed memory; reader.rs).
                       decode_router_wait_s=z.get("router_wait_seconds", 0.0) - p.get("router_wait_seconds", 0.0),
                       decode_array_s=z.get("array_seconds", 0.0) - p.get("array_seconds", 0.0),
                       host_staged=z.get("host_staged_bytes", 0) / max(1, z["bytes_read"]),
                       decode_read_ahead=z["prefetch_issued"] - p["prefetch_issued"],
                       decode_read_ahead_used=z["prefetch_used"] - p["prefetch_used"],
                       io=z["io_mode"], disk_vs_os=(z["os_read_bytes"] or 0) / max(1, z["disk_bytes_read"]),
                       capacity_gb=z["capacity_bytes"] / 1e9)
            if resident:
                row["ratio_to_resident"] = row["decode_tps"] / resident["decode_tps"]
                if bw:
                    bound = serial_bound(resident["decode_tps"], row["decode_mb_per_token"], bw)
                    row["serial_bound_tps"] = bound
                    row["pct_of_bound"] = row["decode_tps"] / bound
                row["same_tokens"] = row["ids"] == resident["ids"]
        if resident and row is not resident:
            row["vs_resident"] = compare(r, resident["raw"])
        row["raw"] = r
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k not in ("ids", "raw")}), flush=True)
    # The bound against the fastest resident run as well: on CUDA the first
    # run also compiles kernels, and resident speed varies from run to run.
    fastest = max((r["decode_tps"] for r in rows if r["run"] == "resident"), default=None)
    if fastest and bw:
        for row in rows:
            if "decode_mb_per_token" in row:
                bound = serial_bound(fastest, row["decode_mb_per_token"], bw)
                row["pct_of_bound_fastest_resident"] = row["decode_tps"] / bound
                print(f"{row['run']}: {row['decode_tps']:.1f} tok/s = {100 * row['decode_tps'] / bound:.0f}% of {bound:.1f} "
                      f"(the bound with the fastest resident run, {fastest:.1f} tok/s)")
    # The disk again at the readers' depth: a cloud disk's rate can change over
    # a run (burst credits, the model's own writeback right after it was made).
    disk_after = {} if a.no_probe else probe_disk(a.model, eb, [a.readers])
    for d, bw_after in disk_after.items():
        print(f"disk after the runs: O_DIRECT {eb} B reads at depth {d}: {bw_after:.2f} GB/s")
    if a.out:
        for row in rows:
            row["logprobs"] = row.pop("raw")["generated_logprobs"]
        Path(a.out).write_text(json.dumps({"disk_gbps": disk, "disk_gbps_after": disk_after, "expert_bytes": eb, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
