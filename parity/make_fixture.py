"""Builds a tiny random-weight model with mlx-lm itself, and mlx-lm's own greedy
output on it: the reference our engine must match token for token.

usage: python make_fixture.py SPEC_JSON OUT_DIR

SPEC_JSON: {"config": {...HF config.json fields...}, "dtype": "bfloat16",
            "quantize": null | {"bits": 4, "group_size": 64, "mode": "affine" | "mxfp4", "only": "experts"},
            "prompt_tokens": 600, "max_tokens": 64, "seed": 0,
            "batch_prompt_tokens": [530, 200, 40],
            "kv_bits": null | 8, "kv_group_size": 64, "quantized_kv_start": 0,
            "penalties": null | {"repetition_penalty": 1.3, "presence_penalty": 0.5,
                                 "presence_context_size": 15, ...}}
Writes OUT_DIR/{config.json, model.safetensors(.index.json), tokenizer files,
reference.json}. reference.json holds the prompt ids, mlx-lm's greedy tokens (with
"penalties", after mlx-lm's logits processors made from them) and
the logits of the first generated position (float32, for the tolerance check),
and under "batch" more prompts of other lengths with mlx-lm's greedy tokens for
each, decoded alone: the engine must give each the same tokens when they share
a batch.
"""

import json
import math
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_logits_processors
from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

from make_tokenizer import write_tokenizer


def main():
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    seed = spec.get("seed", 0)
    mx.random.seed(seed)

    config = dict(spec["config"])
    vocab = write_tokenizer(out, config["vocab_size"])
    assert vocab == config["vocab_size"], (vocab, config["vocab_size"])

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    # Random weights with a spread that keeps activations in a sane range, so the
    # greedy path is not decided by float noise. Norm weights stay near 1.
    def init(path, p):
        if "norm" in path:
            return 1.0 + 0.1 * mx.random.normal(p.shape)
        if "embed" in path or "lm_head" in path:
            return spec.get("embed_std", 0.02) * mx.random.normal(p.shape)
        return spec.get("weight_std", 0.2) * mx.random.normal(p.shape)

    flat = [(k, init(k, v)) for k, v in tree_flatten(model.parameters())]
    model.update(tree_map(lambda x: x, dict_to_tree(flat)))
    dtype = getattr(mx, spec.get("dtype", "bfloat16"))
    model.set_dtype(dtype)
    if spec.get("quantize"):
        q = spec["quantize"]
        # "only": quantize just the layers whose path holds it (e.g. a checkpoint
        # whose experts alone are quantized, as openai/gpt-oss ships them).
        only = (lambda path, _: q["only"] in path) if q.get("only") else None
        model, config = quantize_model(model, config, q["group_size"], q["bits"], mode=q.get("mode", "affine"), quant_predicate=only)
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(config, out / "config.json")

    # The prompts: fixed pseudo-random token sequences (no specials).
    def random_prompt(n, key_seed):
        return mx.random.randint(3, vocab, (n,), key=mx.random.key(key_seed)).tolist()

    def greedy(prompt):
        tokens, first_logits = [], None
        gen = generate_step(
            mx.array(prompt),
            model,
            max_tokens=spec.get("max_tokens", 64),
            prefill_step_size=spec.get("prefill_size", 512),
            kv_bits=spec.get("kv_bits"),
            kv_group_size=spec.get("kv_group_size", 64),
            quantized_kv_start=spec.get("quantized_kv_start", 0),
            logits_processors=make_logits_processors(**spec["penalties"]) if spec.get("penalties") else None,
        )
        for token, logprobs in gen:
            if first_logits is None:
                # JSON has no infinities: non-finite values are written as null.
                first_logits = [
                    v if math.isfinite(v) else None
                    for v in logprobs.astype(mx.float32).tolist()
                ]
            tokens.append(int(token))
        return tokens, first_logits

    prompt = random_prompt(spec.get("prompt_tokens", 600), seed + 1)
    tokens, first_logits = greedy(prompt)
    batch = []
    for i, n in enumerate(spec.get("batch_prompt_tokens", [530, 200, 40])):
        extra = random_prompt(n, seed + 100 + i)
        batch.append({"prompt": extra, "tokens": greedy(extra)[0]})
    (out / "reference.json").write_text(
        json.dumps(
            {
                "prompt": prompt,
                "tokens": tokens,
                "first_logprobs": first_logits,
                "batch": batch,
                "spec": spec,
            }
        )
    )


def dict_to_tree(flat):
    from mlx.utils import tree_unflatten

    return tree_unflatten(flat)


if __name__ == "__main__":
    main()
