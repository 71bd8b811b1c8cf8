"""Writes a parity fixture (an mlx-lm model folder) as a GGUF file the way
llama.cpp's converter lays one out, so the GGUF loader can be checked against
mlx-lm's tokens on the same weights.

usage: python hf_to_gguf.py FIXTURE_DIR OUT.gguf [q5_0 DEQUANT_DIR | split N]

With `split N`, the file is written as N shards as llama.cpp's gguf-split
writes them (OUT-00001-of-0000N.gguf, ...: the metadata in the first).

With `q5_0`, float weight matrices are written as Q5_0 blocks (a type MLX
cannot hold, so the loader dequantizes it), and DEQUANT_DIR receives the
fixture with those matrices replaced by their dequantized values in bfloat16:
what loading the GGUF file must amount to.

What llama.cpp's converter does and this mirrors: tensor names (token_embd,
blk.N.attn_q, ...), the rows of q and k permuted for the Llama converter's
families (llama, mixtral), Gemma's RMS norm weights stored as 1 + w (here in
their own dtype, the sum mlx-lm's Gemma computes; llama.cpp writes float32), Llama 3
rope scaling stored as a `rope_freqs` factor per rotated pair, Phi-3's long
rope factors as `rope_factors_long`/`rope_factors_short`, the architecture's
metadata keys, and the byte-level BPE vocabulary, merges and chat template
under tokenizer.ggml.*. Float tensors are written as stored (F32, F16, BF16);
4-bit MLX affine tensors with group size 32 and float16 scales become Q4_1
blocks, which hold exactly the same values. Other quantizations are refused.
"""

import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

ARCH = {"llama": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
        "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "olmoe": "olmoe", "phi3": "phi3",
        "gemma3_text": "gemma3"}

LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "mlp.gate_up_proj": "ffn_up",
         "mlp.gate": "ffn_gate_inp", "block_sparse_moe.gate": "ffn_gate_inp",
         "mlp.switch_mlp.gate_proj": "ffn_gate_exps", "mlp.switch_mlp.up_proj": "ffn_up_exps",
         "mlp.switch_mlp.down_proj": "ffn_down_exps",
         "block_sparse_moe.switch_mlp.gate_proj": "ffn_gate_exps",
         "block_sparse_moe.switch_mlp.up_proj": "ffn_up_exps",
         "block_sparse_moe.switch_mlp.down_proj": "ffn_down_exps",
         "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
         "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
GEMMA_LAYER = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}
TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_name(hf, gemma):
    stem, suffix = hf.rsplit(".", 1)
    if stem in TOP:
        return f"{TOP[stem]}.{suffix}"
    _, _, layer, part = stem.split(".", 3)
    table = {**LAYER, **GEMMA_LAYER} if gemma else LAYER
    return f"blk.{layer}.{table[part]}.{suffix}"


def permute(w, heads):
    """llama.cpp's row order for q/k: each head's rows as (index, pair half)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, heads):
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_numpy(a):
    """(values, GGUF type) of a float MLX array, bit for bit."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)), GGMLQuantizationType.BF16
    if a.dtype == mx.float16:
        return np.array(a), GGMLQuantizationType.F16
    return np.array(a.astype(mx.float32)), GGMLQuantizationType.F32


def q4_1_blocks(w, scales, biases):
    """MLX affine 4-bit (group 32, float16 scales/biases) as Q4_1 blocks:
    d, m (float16), then 16 bytes: value j in the low nibble of byte j and
    value j + 16 in its high nibble."""
    words = np.array(w).astype(np.uint32)
    codes = np.stack([(words >> (4 * k)) & 15 for k in range(8)], axis=-1).reshape(*words.shape[:-1], -1)
    rows = codes.reshape(-1, codes.shape[-1] // 32, 32).astype(np.uint8)
    qs = rows[..., :16] | (rows[..., 16:] << 4)
    d = np.array(scales).astype(np.float16).reshape(rows.shape[0], -1, 1).view(np.uint8)
    m = np.array(biases).astype(np.float16).reshape(rows.shape[0], -1, 1).view(np.uint8)
    blocks = np.concatenate([d, m, qs], axis=-1)  # [rows, groups, 20]
    return blocks.reshape(*words.shape[:-1], -1)


def llama3_factors(dims, base, s):
    """The llama3 rope's period multipliers, as mlx-lm computes its frequencies."""
    freqs = base ** (np.arange(0, dims, 2, dtype=np.float32) / dims)
    wavelens = 2 * np.pi * freqs
    low, high = s["original_max_position_embeddings"] / s["low_freq_factor"], s["original_max_position_embeddings"] / s["high_freq_factor"]
    f = np.where(wavelens > low, freqs * s["factor"], freqs)
    smooth = (s["original_max_position_embeddings"] / wavelens - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    medium = (wavelens > high) & (wavelens < low)
    f = np.where(medium, f / ((1 - smooth) / s["factor"] + smooth), f)
    return (f / freqs).astype(np.float32)


def main():
    src, out = Path(sys.argv[1]), sys.argv[2]
    requant = len(sys.argv) > 3 and sys.argv[3] == "q5_0"
    shards = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "split" else 1
    dequantized = {}
    cfg = json.loads((src / "config.json").read_text())
    mt = cfg["model_type"]
    arch = ARCH[mt]
    gemma = arch == "gemma3"
    weights = {}
    for f in sorted(src.glob("*.safetensors")):
        weights.update(mx.load(str(f)))
    q = cfg.get("quantization")
    if q and (q["bits"], q["group_size"]) != (4, 32):
        sys.exit(f"only 4-bit group-32 quantization maps onto a GGUF block type exactly (got {q})")

    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    if mt in ("qwen2", "qwen2_moe", "mixtral", "phi3"):
        head_dim = hidden // heads  # mlx-lm derives it for these
    n_tensors = sum(not k.endswith((".scales", ".biases")) for k in weights)
    w = GGUFWriter(out, arch, split_max_tensors=-(-n_tensors // shards) if shards > 1 else 0)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    default_theta = {"llama": 10000.0, "phi3": 10000.0, "olmoe": 10000.0}.get(mt, 1000000.0)
    w.add_rope_freq_base(cfg.get("rope_theta", default_theta))
    rope_dims = int(head_dim * cfg.get("partial_rotary_factor", 1.0))
    w.add_rope_dimension_count(rope_dims)
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if "shared_expert_intermediate_size" in cfg:
            w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if gemma:
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern(cfg["sliding_window_pattern"])
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("type") or scaling.get("rope_type")
    if kind == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_factors(rope_dims, cfg.get("rope_theta", default_theta), scaling))
    elif kind in ("longrope", "su"):
        w.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])
        w.add_tensor("rope_factors_long.weight", np.array(scaling["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(scaling["short_factor"], dtype=np.float32))
    elif kind == "linear":
        w.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling["factor"])
    elif kind not in (None, "default"):
        sys.exit(f"rope scaling {kind} is not written by this tool")

    for name in sorted(weights):
        if name.endswith((".scales", ".biases")):
            continue
        a = weights[name]
        stem = name[: -len(".weight")] if name.endswith(".weight") else None
        n_perm = None
        if arch == "llama" and stem and stem.endswith("self_attn.q_proj"):
            n_perm = heads
        if arch == "llama" and stem and stem.endswith("self_attn.k_proj"):
            n_perm = kv_heads
        target = gguf_name(name, gemma)
        if stem and f"{stem}.scales" in weights:
            blocks = q4_1_blocks(a, weights[f"{stem}.scales"], weights[f"{stem}.biases"])
            if n_perm:
                blocks = permute(blocks, n_perm)
            w.add_tensor(target, np.ascontiguousarray(blocks), raw_dtype=GGMLQuantizationType.Q4_1)
            continue
        if gemma and name.endswith("norm.weight"):
            a = 1.0 + a  # in the stored dtype, as mlx-lm's Gemma adds it
        if requant and a.ndim >= 2 and a.shape[-1] % 32 == 0:
            values = np.array(a.astype(mx.float32))
            blocks = quantize(permute(values, n_perm) if n_perm else values, GGMLQuantizationType.Q5_0)
            w.add_tensor(target, blocks, raw_dtype=GGMLQuantizationType.Q5_0)
            back = dequantize(blocks, GGMLQuantizationType.Q5_0).reshape(values.shape)
            dequantized[name] = mx.array(unpermute(back, n_perm) if n_perm else back).astype(mx.bfloat16)
            continue
        values, ty = to_numpy(a)
        if n_perm:
            values = permute(values, n_perm)
        w.add_tensor(target, np.ascontiguousarray(values), raw_dtype=ty)

    tok = json.loads((src / "tokenizer.json").read_text())
    tcfg = json.loads((src / "tokenizer_config.json").read_text())
    vocab = {**tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok["added_tokens"]}}
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    special = {t["id"] for t in tok["added_tokens"] if t["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_eos_token_id(vocab[tcfg["eos_token"]])
    w.add_pad_token_id(vocab[tcfg["pad_token"]])
    w.add_add_bos_token(False)
    w.add_chat_template(tcfg["chat_template"])

    if requant:
        folder = Path(sys.argv[4])
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(src / f, folder / f)
        mx.save_safetensors(str(folder / "model.safetensors"), {**weights, **dequantized}, metadata={"format": "mlx"})

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
