"""Writes a random-weight quantized MoE model in mlx-community's layout, one shard per
layer, straight from numpy: a Qwen3-30B-A3B-shaped model (17 GB) takes about a
minute, without ever holding the float weights. Speed and I/O do not depend on
the values; every expert gets its own random bytes, so a wrong slot mapping shows.

Qwen3-MoE shapes: stacked switch_mlp experts, affine 4-bit, group 64, bf16 scales and
biases. gpt-oss shapes: as mlx-community's MXFP4-Q8 conversions, experts in mxfp4
(group 32, e8m0 byte scales) with a bf16 bias per expert, everything else affine 8-bit
(group 64), attention with biases and sinks.

usage: python make_moe_model.py SHAPE OUT_DIR [--seed 0] [--embed-scale 1]
SHAPE: qwen3-30b-a3b | qwen3-moe-cpu (a small one for CPU benchmark runs) | gpt-oss-20b |
       qwen3.5-35b-a3b | gemma-4-26b-a4b

Qwen3.5-MoE shapes: a `qwen3_5_moe` checkpoint as mlx-community's 4-bit conversions lay
it out (tensors under `language_model.`): Gated DeltaNet layers with a gated full-attention
layer every fourth, 4-bit everything but the routers and shared-expert gates (8-bit), the
convolutions, norms and decay parameters. Gemma 4 MoE shapes: a `gemma4_text` checkpoint,
five sliding-window layers to one full, the MoE block beside the dense MLP, 4-bit but the
routers (8-bit) and norms.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "parity"))
from make_tokenizer import write_tokenizer  # noqa: E402

SHAPES = {
    # Qwen/Qwen3-30B-A3B
    "qwen3-30b-a3b": {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                      "num_key_value_heads": 4, "head_dim": 128, "moe_intermediate_size": 768,
                      "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936},
    # No published checkpoint: many experts at a size MLX's CPU backend decodes in seconds.
    "qwen3-moe-cpu": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
                      "num_key_value_heads": 2, "head_dim": 64, "moe_intermediate_size": 512,
                      "num_experts": 64, "num_experts_per_tok": 8, "vocab_size": 8192},
    # Qwen/Qwen3.5-35B-A3B as we understand its config (40 layers, 10 of them full
    # attention; 256 experts, 8 routed + 1 shared): not checked against the published
    # file, which this machine cannot reach.
    "qwen3.5-35b-a3b": {"model_type": "qwen3_5_moe", "hidden_size": 2048, "num_hidden_layers": 40,
                        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                        "num_experts": 256, "num_experts_per_tok": 8, "vocab_size": 248320,
                        "linear_num_value_heads": 32, "linear_num_key_heads": 16,
                        "linear_key_head_dim": 128, "linear_value_head_dim": 128},
    # google/gemma-4-26b-a4b's text model as configs in public code give it (30 layers
    # assumed, five sliding to one full).
    "gemma-4-26b-a4b": {"model_type": "gemma4_text", "hidden_size": 2816, "num_hidden_layers": 30,
                        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
                        "global_head_dim": 512, "num_global_key_value_heads": 2, "intermediate_size": 2112,
                        "moe_intermediate_size": 704, "num_experts": 128, "num_experts_per_tok": 8,
                        "vocab_size": 262144},
    # openai/gpt-oss-20b
    "gpt-oss-20b": {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                    "moe_intermediate_size": 2880, "num_experts": 32, "num_experts_per_tok": 4,
                    "vocab_size": 201088},
}
GROUP, BITS = 64, 4


def bf16(x):
    """float32 array -> bf16 bits (uint16), rounded to nearest even."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class Shard:
    def __init__(self):
        self.tensors = []

    def add(self, name, arr, dtype):
        self.tensors.append((name, arr, dtype))

    def write(self, path):
        header, offset = {}, 0
        for name, arr, dtype in self.tensors:
            header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
            offset += arr.nbytes
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(path, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for _, arr, _ in self.tensors:
                f.write(np.ascontiguousarray(arr).data)


def quantized(shard, rng, name, shape, scale=1.0):
    """A random affine 4-bit matrix [..., rows, cols]: packed uint32, bf16 scales/biases."""
    *lead, rows, cols = shape
    shard.add(f"{name}.weight", rng.integers(0, 2**32, (*lead, rows, cols * BITS // 32), dtype=np.uint32), "U32")
    # Values scale * q + bias with q in 0..15 centred on 0: std about 0.02 / sqrt(cols / 512).
    s = scale * (0.02 / 4.6) * np.sqrt(512 / cols) * (1 + 0.1 * rng.standard_normal((*lead, rows, cols // GROUP), dtype=np.float32))
    shard.add(f"{name}.scales", bf16(s), "BF16")
    shard.add(f"{name}.biases", bf16(-7.5 * s), "BF16")


def affine8(shard, rng, name, shape, overrides, scale=1.0):
    """A random affine 8-bit matrix (group 64), named in the config's per-layer overrides."""
    *lead, rows, cols = shape
    shard.add(f"{name}.weight", rng.integers(0, 2**32, (*lead, rows, cols // 4), dtype=np.uint32), "U32")
    s = scale * (0.02 / 74) * np.sqrt(512 / cols) * (1 + 0.1 * rng.standard_normal((*lead, rows, cols // 64), dtype=np.float32))
    shard.add(f"{name}.scales", bf16(s), "BF16")
    shard.add(f"{name}.biases", bf16(-127.5 * s), "BF16")
    overrides[name] = {"group_size": 64, "bits": 8}


def mxfp4(shard, rng, name, shape):
    """A random mxfp4 matrix (group 32): packed e2m1 nibbles, e8m0 byte scales near 2^-7
    (values of std about 0.02)."""
    *lead, rows, cols = shape
    shard.add(f"{name}.weight", rng.integers(0, 2**32, (*lead, rows, cols // 8), dtype=np.uint32), "U32")
    shard.add(f"{name}.scales", rng.integers(118, 122, (*lead, rows, cols // 32), dtype=np.uint8), "U8")


def small(rng, shape):
    return bf16(0.01 * rng.standard_normal(shape, dtype=np.float32))


def qwen3_moe_layer(s, rng, i, c, overrides):
    p = f"model.layers.{i}"
    h, hd, e, moe = c["hidden_size"], c["head_dim"], c["num_experts"], c["moe_intermediate_size"]
    q_heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    ones = lambda n: np.full(n, 0x3F80, np.uint16)
    for n in ["input_layernorm", "post_attention_layernorm"]:
        s.add(f"{p}.{n}.weight", ones(h), "BF16")
    s.add(f"{p}.self_attn.q_norm.weight", ones(hd), "BF16")
    s.add(f"{p}.self_attn.k_norm.weight", ones(hd), "BF16")
    quantized(s, rng, f"{p}.self_attn.q_proj", (q_heads * hd, h))
    quantized(s, rng, f"{p}.self_attn.k_proj", (kv_heads * hd, h))
    quantized(s, rng, f"{p}.self_attn.v_proj", (kv_heads * hd, h))
    quantized(s, rng, f"{p}.self_attn.o_proj", (h, q_heads * hd))
    quantized(s, rng, f"{p}.mlp.gate", (e, h))
    quantized(s, rng, f"{p}.mlp.switch_mlp.gate_proj", (e, moe, h))
    quantized(s, rng, f"{p}.mlp.switch_mlp.up_proj", (e, moe, h))
    quantized(s, rng, f"{p}.mlp.switch_mlp.down_proj", (e, h, moe))


def gpt_oss_layer(s, rng, i, c, overrides):
    p = f"model.layers.{i}"
    h, hd, e, inter = c["hidden_size"], c["head_dim"], c["num_experts"], c["moe_intermediate_size"]
    q_heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    ones = np.full(h, 0x3F80, np.uint16)
    s.add(f"{p}.input_layernorm.weight", ones, "BF16")
    s.add(f"{p}.post_attention_layernorm.weight", ones, "BF16")
    for n, (rows, cols) in {"q_proj": (q_heads * hd, h), "k_proj": (kv_heads * hd, h), "v_proj": (kv_heads * hd, h),
                            "o_proj": (h, q_heads * hd)}.items():
        affine8(s, rng, f"{p}.self_attn.{n}", (rows, cols), overrides)
        s.add(f"{p}.self_attn.{n}.bias", small(rng, (rows,)), "BF16")
    s.add(f"{p}.self_attn.sinks", small(rng, (q_heads,)), "BF16")
    affine8(s, rng, f"{p}.mlp.router", (e, h), overrides)
    s.add(f"{p}.mlp.router.bias", small(rng, (e,)), "BF16")
    for n, (rows, cols) in {"gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}.items():
        mxfp4(s, rng, f"{p}.mlp.experts.{n}", (e, rows, cols))
        s.add(f"{p}.mlp.experts.{n}.bias", small(rng, (e, rows)), "BF16")


def gpt_oss_config(c, overrides):
    layers = c["num_hidden_layers"]
    return {"model_type": "gpt_oss", "hidden_size": c["hidden_size"], "num_hidden_layers": layers,
            "intermediate_size": c["moe_intermediate_size"], "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
            "num_local_experts": c["num_experts"], "num_experts_per_tok": c["num_experts_per_tok"],
            "vocab_size": c["vocab_size"], "rms_norm_eps": 1e-5, "sliding_window": 128, "rope_theta": 150000,
            "max_position_embeddings": 131072, "tie_word_embeddings": False,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "original_max_position_embeddings": 4096, "truncate": False},
            "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
            "quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4", **overrides}}


def qwen3_5_layer(s, rng, i, c, overrides):
    p = f"language_model.model.layers.{i}"
    h, e, moe, shared = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    ones = lambda n: np.full(n, 0x3F80, np.uint16)
    s.add(f"{p}.input_layernorm.weight", ones(h), "BF16")
    s.add(f"{p}.post_attention_layernorm.weight", ones(h), "BF16")
    if (i + 1) % 4:
        nk, nv, dk, dv = c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
        channels = 2 * nk * dk + nv * dv
        a = f"{p}.linear_attn"
        quantized(s, rng, f"{a}.in_proj_qkv", (channels, h))
        quantized(s, rng, f"{a}.in_proj_z", (nv * dv, h))
        quantized(s, rng, f"{a}.in_proj_b", (nv, h))
        quantized(s, rng, f"{a}.in_proj_a", (nv, h))
        s.add(f"{a}.conv1d.weight", bf16(0.3 * rng.standard_normal((channels, 4, 1), dtype=np.float32)), "BF16")
        s.add(f"{a}.dt_bias", ones(nv), "BF16")
        s.add(f"{a}.A_log", np.log(rng.uniform(1, 16, nv)).astype(np.float32), "F32")
        s.add(f"{a}.norm.weight", ones(dv), "BF16")
        quantized(s, rng, f"{a}.out_proj", (h, nv * dv))
    else:
        hd, q_heads, kv_heads = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
        a = f"{p}.self_attn"
        quantized(s, rng, f"{a}.q_proj", (2 * q_heads * hd, h))
        quantized(s, rng, f"{a}.k_proj", (kv_heads * hd, h))
        quantized(s, rng, f"{a}.v_proj", (kv_heads * hd, h))
        quantized(s, rng, f"{a}.o_proj", (h, q_heads * hd))
        s.add(f"{a}.q_norm.weight", ones(hd), "BF16")
        s.add(f"{a}.k_norm.weight", ones(hd), "BF16")
    affine8(s, rng, f"{p}.mlp.gate", (e, h), overrides)
    quantized(s, rng, f"{p}.mlp.switch_mlp.gate_proj", (e, moe, h))
    quantized(s, rng, f"{p}.mlp.switch_mlp.up_proj", (e, moe, h))
    quantized(s, rng, f"{p}.mlp.switch_mlp.down_proj", (e, h, moe))
    quantized(s, rng, f"{p}.mlp.shared_expert.gate_proj", (shared, h))
    quantized(s, rng, f"{p}.mlp.shared_expert.up_proj", (shared, h))
    quantized(s, rng, f"{p}.mlp.shared_expert.down_proj", (h, shared))
    affine8(s, rng, f"{p}.mlp.shared_expert_gate", (1, h), overrides)


def gemma4_full(i):
    return (i + 1) % 6 == 0


def gemma4_layer(s, rng, i, c, overrides):
    p = f"model.layers.{i}"
    h, e, moe, inter, heads = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["intermediate_size"], c["num_attention_heads"]
    ones = lambda n: np.full(n, 0x3F80, np.uint16)
    for n in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
              "pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"]:
        s.add(f"{p}.{n}.weight", ones(h), "BF16")
    s.add(f"{p}.layer_scalar", ones(1), "BF16")
    full = gemma4_full(i)
    hd = c["global_head_dim"] if full else c["head_dim"]
    kv = c["num_global_key_value_heads"] if full else c["num_key_value_heads"]
    a = f"{p}.self_attn"
    quantized(s, rng, f"{a}.q_proj", (heads * hd, h))
    quantized(s, rng, f"{a}.k_proj", (kv * hd, h))
    if not full:  # full layers take their values from the keys (attention_k_eq_v)
        quantized(s, rng, f"{a}.v_proj", (kv * hd, h))
    quantized(s, rng, f"{a}.o_proj", (h, heads * hd))
    s.add(f"{a}.q_norm.weight", ones(hd), "BF16")
    s.add(f"{a}.k_norm.weight", ones(hd), "BF16")
    quantized(s, rng, f"{p}.mlp.gate_proj", (inter, h))
    quantized(s, rng, f"{p}.mlp.up_proj", (inter, h))
    quantized(s, rng, f"{p}.mlp.down_proj", (h, inter))
    affine8(s, rng, f"{p}.router.proj", (e, h), overrides)
    s.add(f"{p}.router.scale", ones(h), "BF16")
    s.add(f"{p}.router.per_expert_scale", ones(e), "BF16")
    quantized(s, rng, f"{p}.experts.switch_glu.gate_proj", (e, moe, h))
    quantized(s, rng, f"{p}.experts.switch_glu.up_proj", (e, moe, h))
    quantized(s, rng, f"{p}.experts.switch_glu.down_proj", (e, h, moe))


def gemma4_config(c, overrides):
    layers = c["num_hidden_layers"]
    return {"model_type": "gemma4_text", "hidden_size": c["hidden_size"], "num_hidden_layers": layers,
            "intermediate_size": c["intermediate_size"], "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
            "global_head_dim": c["global_head_dim"], "num_global_key_value_heads": c["num_global_key_value_heads"],
            "attention_k_eq_v": True, "vocab_size": c["vocab_size"], "vocab_size_per_layer_input": c["vocab_size"],
            "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0, "sliding_window": 1024,
            "layer_types": ["full_attention" if gemma4_full(i) else "sliding_attention" for i in range(layers)],
            "final_logit_softcapping": 30.0, "use_double_wide_mlp": False, "enable_moe_block": True,
            "num_experts": c["num_experts"], "top_k_experts": c["num_experts_per_tok"],
            "moe_intermediate_size": c["moe_intermediate_size"], "rms_norm_eps": 1e-6,
            "max_position_embeddings": 262144, "tie_word_embeddings": True,
            "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                                   "rope_type": "proportional"},
                                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
            "quantization": {"group_size": GROUP, "bits": BITS, **overrides}}


def qwen3_5_config(c, overrides):
    text = {k: v for k, v in c.items() if k != "model_type"}
    text.update({"model_type": "qwen3_5_moe_text", "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
                 "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 262144,
                 "norm_topk_prob": True, "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                 "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": True}})
    return {"model_type": "qwen3_5_moe", "text_config": text, "tie_word_embeddings": False,
            "quantization": {"group_size": GROUP, "bits": BITS, **overrides}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--embed-scale", type=float, default=1.0,
                    help="scales the token embeddings: with random weights the residual stream collapses onto a "
                         "direction every token shares, so the routers pick the same few experts for any prompt "
                         "(qwen3-moe-cpu, 512 random tokens: 64, 47, 38, 30, 27, 27, 20, 21 of 64 experts in its 8 "
                         "layers); 100 keeps each token's own embedding in front and a prompt reaches every expert "
                         "of every layer, as a trained model's prefill does")
    a = ap.parse_args()
    c = SHAPES[a.shape]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    ones = lambda n: np.full(n, 0x3F80, np.uint16)  # bf16 1.0
    weight_map, overrides = {}, {}
    shards = layers + 1
    gpt_oss = c.get("model_type") == "gpt_oss"
    qwen3_5 = c.get("model_type") == "qwen3_5_moe"
    gemma4 = c.get("model_type") == "gemma4_text"
    write_layer = qwen3_5_layer if qwen3_5 else gemma4_layer if gemma4 else gpt_oss_layer if gpt_oss else qwen3_moe_layer
    for i in range(layers):
        s = Shard()
        write_layer(s, rng, i, c, overrides)
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        s.write(out / name)
        weight_map.update({t[0]: name for t in s.tensors})
    s = Shard()
    if qwen3_5:
        quantized(s, rng, "language_model.model.embed_tokens", (vocab, h), a.embed_scale)
        quantized(s, rng, "language_model.lm_head", (vocab, h))
        s.add("language_model.model.norm.weight", ones(h), "BF16")
    elif gemma4:
        quantized(s, rng, "model.embed_tokens", (vocab, h), a.embed_scale)
    elif gpt_oss:
        affine8(s, rng, "model.embed_tokens", (vocab, h), overrides, a.embed_scale)
        affine8(s, rng, "lm_head", (vocab, h), overrides)
    else:
        quantized(s, rng, "model.embed_tokens", (vocab, h), a.embed_scale)
        quantized(s, rng, "lm_head", (vocab, h))
    if not qwen3_5:
        s.add("model.norm.weight", ones(h), "BF16")
    name = f"model-{shards:05d}-of-{shards:05d}.safetensors"
    s.write(out / name)
    weight_map.update({t[0]: name for t in s.tensors})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    config = gemma4_config(c, overrides) if gemma4 else qwen3_5_config(c, overrides) if qwen3_5 else gpt_oss_config(c, overrides) if gpt_oss else {"model_type": "qwen3_moe", "intermediate_size": 6144, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "tie_word_embeddings": False, "max_position_embeddings": 40960, "decoder_sparse_step": 1,
              "mlp_only_layers": [], "norm_topk_prob": True, "quantization": {"group_size": GROUP, "bits": BITS}, **c}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    write_tokenizer(out, vocab)
    print(json.dumps({"shape": a.shape, "dir": str(out)}))


if __name__ == "__main__":
    main()
