"""Writes a random-weight model with the real shapes of a known checkpoint, built
by mlx-lm itself (so both engines load the same files), plus a tokenizer of the
exact vocabulary size. Speed does not depend on weight values.

usage: python make_model.py NAME OUT_DIR [--bits 4] [--dtype bfloat16]
NAME: one of SHAPES below.
"""

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "parity"))
from make_tokenizer import write_tokenizer  # noqa: E402

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

SHAPES = {
    # HuggingFaceTB/SmolLM2-135M
    "smollm2-135m": {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
                     "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
                     "rms_norm_eps": 1e-5, "vocab_size": 49152, "rope_theta": 100000.0,
                     "tie_word_embeddings": True, "max_position_embeddings": 8192},
    # No published checkpoint: a small Llama for CPU benchmark runs, where MLX's matmul runs at
    # a few GFLOP/s and even SmolLM2-135M prefills ~11 tokens/s.
    "llama-tiny": {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
                   "intermediate_size": 768, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "rms_norm_eps": 1e-5, "vocab_size": 8192, "rope_theta": 500000.0,
                   "tie_word_embeddings": True, "max_position_embeddings": 32768},
    # meta-llama/Llama-3.2-1B
    "llama-3.2-1b": {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
                     "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "head_dim": 64, "rms_norm_eps": 1e-5, "vocab_size": 128256, "rope_theta": 500000.0,
                     "rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": True,
                     "max_position_embeddings": 131072},
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
                     "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "rms_norm_eps": 1e-5, "vocab_size": 128256, "rope_theta": 500000.0,
                     "rope_scaling": dict(LLAMA3_ROPE, factor=8.0), "tie_word_embeddings": False,
                     "max_position_embeddings": 131072},
    # google/gemma-3-1b-it: five sliding-window layers (512 positions) to one global layer.
    "gemma-3-1b": {"model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 26,
                   "intermediate_size": 6912, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "head_dim": 256, "rms_norm_eps": 1e-6, "vocab_size": 262144, "rope_theta": 1000000.0,
                   "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256, "sliding_window": 512,
                   "sliding_window_pattern": 6, "max_position_embeddings": 32768},
    # No published checkpoint: Gemma 3's layer pattern at llama-tiny's size, for CPU runs.
    "gemma3-tiny": {"model_type": "gemma3_text", "hidden_size": 256, "num_hidden_layers": 6,
                    "intermediate_size": 768, "num_attention_heads": 4, "num_key_value_heads": 1,
                    "head_dim": 64, "rms_norm_eps": 1e-6, "vocab_size": 8192, "rope_theta": 1000000.0,
                    "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 64, "sliding_window": 256,
                    "sliding_window_pattern": 3, "max_position_embeddings": 32768},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--bits", type=int, default=None)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    config = dict(SHAPES[a.name])
    mx.random.seed(0)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    dtype = getattr(mx, a.dtype)
    # Small random values, norm weights 1: activations stay finite.
    flat = [
        (k, mx.ones(p.shape, dtype) if "norm" in k else (0.02 * mx.random.normal(p.shape)).astype(dtype))
        for k, p in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(flat))
    if a.bits:
        model, config = quantize_model(model, config, a.group_size, a.bits)
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(config, out / "config.json")
    write_tokenizer(out, config["vocab_size"])
    print(json.dumps({"model": a.name, "bits": a.bits, "dir": str(out)}))


if __name__ == "__main__":
    main()
