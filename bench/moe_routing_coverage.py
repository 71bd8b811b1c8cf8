"""How many of each MoE layer's experts one prompt reaches, by mlx-lm's own forward pass
(Qwen3-MoE models): a prefill streams every expert its chunks reach, so a bench model
whose routing collapses onto a few experts measures little of the disk (issue 11).

usage: python bench/moe_routing_coverage.py MODEL_DIR [--tokens 512] [--seed 0]

Prints, per layer, the distinct experts the top-k routers chose for a prompt of random
token ids.
"""

import argparse
import json
import random

import mlx.core as mx
import numpy as np
from mlx_lm import load
from mlx_lm.models import qwen3_moe


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    chosen = []
    forward = qwen3_moe.Qwen3MoeSparseMoeBlock.__call__

    def recording(block, x):
        gates = block.gate(x)
        chosen.append(mx.argpartition(-gates, kth=block.top_k - 1, axis=-1)[..., : block.top_k])
        return forward(block, x)

    qwen3_moe.Qwen3MoeSparseMoeBlock.__call__ = recording
    model, _ = load(a.model)
    vocab = model.args.vocab_size
    r = random.Random(a.seed)
    mx.eval(model(mx.array([[r.randrange(10, vocab) for _ in range(a.tokens)]])))
    reached = [len(set(np.array(c).flatten().tolist())) for c in chosen]
    print(json.dumps({"model": a.model, "tokens": a.tokens, "experts": model.args.num_experts, "reached_per_layer": reached}))


if __name__ == "__main__":
    main()
