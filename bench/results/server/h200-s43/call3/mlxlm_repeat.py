"""Is mlx-lm's greedy decode of the A3B bench model reproducible on CUDA? One process, one
2048-token random prompt, 64 greedy tokens, three times; prints where the runs part."""
import sys
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

model, tok = load(sys.argv[1])
prompt = mx.array(__import__("numpy").random.default_rng(0).integers(0, 150000, 2048).tolist())
runs = []
for r in range(3):
    ids, lps = [], []
    for (t, logprobs), _ in zip(generate_step(prompt, model, max_tokens=64), range(64)):
        ids.append(int(t)); lps.append(float(logprobs[t]))
    runs.append((ids, lps))
    print(f"run {r}: {ids[:8]}", flush=True)
for i in range(1, 3):
    tok_diff = next((j for j, (p, q) in enumerate(zip(runs[0][0], runs[i][0])) if p != q), None)
    val_diff = next((j for j, (p, q) in enumerate(zip(runs[0][1], runs[i][1])) if p != q), None)
    print(f"mlx-lm run 0 vs {i}: first token differing {tok_diff}, first chosen logprob differing {val_diff}")
