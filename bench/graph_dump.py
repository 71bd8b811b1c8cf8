"""Compares the GPU work each engine submits for the same generation (CUDA only).

MLX writes every CUDA graph it commits as a DOT file when MLX_SAVE_CUDA_GRAPHS_DOT_FILE
names a file prefix. This runs one untimed generation per engine (same model, same
prompt, greedy, --gen-tokens tokens, no warm-up) with that set, each in a fresh process,
then reports the longest run of consecutive commits that are identical in both (same
kernels in the same order, same dependency edges) and counts the kernels outside it.
The dump is written by the same libmlx for both, so the graphs compare directly; it says
what work is submitted, not how long it takes.

usage: python bench/graph_dump.py --model DIR --mlx-serve BIN [--prompt-tokens 512]
           [--gen-tokens 16] [--dump /tmp/graph-dump] [--top 15] [--analyze]
  --analyze: only re-read an existing --dump folder (its mlx-serve/ and mlx-lm/ dumps)
"""

import argparse
import collections
import functools
import glob
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_bench import prompt_text  # noqa: E402

MLX_LM = """
import sys
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import stream_generate
model, tok = load(sys.argv[1])
tok.eos_token_ids = set()
prompt = open(sys.argv[2]).read()
for _ in stream_generate(model, tok, prompt, max_tokens=int(sys.argv[3]), prefill_step_size=int(sys.argv[4])):
    pass
"""

# cudaGraphDebugDotPrint (as MLX calls it) writes each committed graph as a DOT file: one
# cluster per graph (child graphs, e.g. cuDNN attention, in clusters of their own), one
# `"graph_G_node_N"[style=.. shape=.. label="N\n<what>"]` line pair per node, where kernel
# nodes are octagons labelled with the kernel's (mangled) name and child-graph nodes are
# rectangles labelled with the child's graph name; then `"graph_G_node_A" -> "graph_G_node_B"`
# edges.
NODE = re.compile(r'"graph_(\d+)_node_(\d+)"\[style="\w+" shape="(\w+)" label="\d+\n([^\n"]*)')
EDGE = re.compile(r'"graph_(\d+)_node_(\d+)" -> "graph_(\d+)_node_(\d+)"')


def commits(d):
    """Each committed graph of a dump folder, in order: (signature, kernel names)."""
    files = sorted(glob.glob(str(Path(d) / "*.dot")), key=lambda p: int(re.findall(r"(\d+)\.dot$", p)[0]))
    out = []
    for f in files:
        text = open(f, errors="replace").read()
        gid = {}  # graph ids renumbered in order of appearance, so equal structure compares equal
        nodes = []
        for g, n, shape, what in NODE.findall(text):
            g = gid.setdefault(g, len(gid))
            if shape == "rectangle" and what.startswith("graph_"):
                what = "child graph"
            nodes.append((g, int(n), shape, what))
        edges = sorted((gid.get(a, -1), int(b), gid.get(c, -1), int(e)) for a, b, c, e in EDGE.findall(text))
        out.append(((tuple(nodes), tuple(edges)), [w for _, _, sh, w in nodes if sh == "octagon"]))
    return out


def common_run(o, r):
    """Longest run of consecutive commits with identical structure: (len, start in o, start in r)."""
    best = (0, 0, 0)
    prev = [0] * (len(r) + 1)
    for i in range(1, len(o) + 1):
        cur = [0] * (len(r) + 1)
        for j in range(1, len(r) + 1):
            if o[i - 1][0] == r[j - 1][0]:
                cur[j] = prev[j - 1] + 1
                if cur[j] > best[0]:
                    best = (cur[j], i - cur[j], j - cur[j])
        prev = cur
    return best


def analyze(dump, top):
    o, r = commits(Path(dump) / "mlx-serve"), commits(Path(dump) / "mlx-lm")
    ko, kr = sum(len(c[1]) for c in o), sum(len(c[1]) for c in r)
    print(f"mlx-serve: {len(o)} graph commits, {ko} kernel nodes; mlx-lm: {len(r)} commits, {kr} kernel nodes")
    n, i, j = common_run(o, r)
    kn = sum(len(c[1]) for c in o[i:i + n])
    print(f"identical (same kernels in the same order, same dependency edges): mlx-serve commits "
          f"{i + 1}-{i + n} = mlx-lm commits {j + 1}-{j + n}: {n} commits, {kn} kernel nodes")
    rest_o = collections.Counter(short(k) for c in o[:i] + o[i + n:] for k in c[1])
    rest_r = collections.Counter(short(k) for c in r[:j] + r[j + n:] for k in c[1])
    print("kernel nodes outside that run (the start of the prefill, and the one step mlx-lm queues past the last token):")
    print("| kernel | mlx-serve | mlx-lm |")
    print("| --- | --- | --- |")
    for k in sorted(set(rest_o) | set(rest_r), key=lambda k: -(rest_o[k] + rest_r[k]))[:top]:
        print(f"| {k} | {rest_o[k]} | {rest_r[k]} |")


@functools.lru_cache(maxsize=None)
def short(mangled):
    # The kernel's own name (last identifier of the nested name), enough to tell kinds apart.
    if not mangled.startswith("_Z"):
        return mangled[:60]
    try:
        out = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip()
    except OSError:
        return mangled[:60]
    out = re.sub(r"<.*", "", out)
    out = re.sub(r"\(.*", "", out)
    return out.split("::")[-1] or mangled[:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mlx-serve", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=16)
    ap.add_argument("--prefill-size", type=int, default=512)
    ap.add_argument("--dump", default="/tmp/graph-dump")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--analyze", action="store_true", help="only analyze an existing --dump folder")
    a = ap.parse_args()
    if a.analyze:
        return analyze(a.dump, a.top)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    prompt = prompt_text(tok, a.prompt_tokens)
    Path(a.dump).mkdir(parents=True, exist_ok=True)
    pfile = Path(a.dump) / "prompt.txt"
    pfile.write_text(prompt)

    runs = {
        "mlx-serve": [a.mlx_serve, "generate", "--model", a.model, "--prompt", prompt, "--max-tokens",
                      str(a.gen_tokens), "--ignore-chat-template", "--ignore-eos", "--prefill-size",
                      str(a.prefill_size), "--json"],
        "mlx-lm": [sys.executable, "-c", MLX_LM, a.model, str(pfile), str(a.gen_tokens), str(a.prefill_size)],
    }
    for name, cmd in runs.items():
        d = Path(a.dump) / name
        d.mkdir(parents=True, exist_ok=True)
        for f in glob.glob(str(d / "*")):
            os.remove(f)
        env = dict(os.environ, MLX_SAVE_CUDA_GRAPHS_DOT_FILE=str(d / "graph"))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    print(f"prompt {a.prompt_tokens} tokens, {a.gen_tokens} generated, no warm-up")
    analyze(a.dump, a.top)


if __name__ == "__main__":
    sys.exit(main())
