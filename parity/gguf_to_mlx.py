"""Writes a llama-architecture GGUF file (such as the default model,
SmolLM2-135M-Instruct.Q4_1.gguf) as an MLX model folder that mlx-lm loads,
holding exactly the same weights: Q4_0/Q4_1/Q8_0 blocks repacked into MLX
affine quantization (group 32, float16 scales and biases), float tensors as
stored, q/k rows put back in Hugging Face order. Then mlx-lm's greedy tokens
for a chat on that folder, as the reference.

usage: python gguf_to_mlx.py MODEL.gguf OUT_DIR QUESTION MAX_TOKENS

Writes OUT_DIR/{config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, reference.json}; reference.json holds the chat prompt's
ids (mlx-lm's tokenizer through the chat template) and the greedy tokens.
Written apart from the server's GGUF loader (gguf's own reader, numpy), so the
two check each other.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(name):
    parts = name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{NAMES[parts[2]]}.{parts[3]}"
    return f"{TOP[parts[0]]}.{parts[1]}"


def unpermute(w, heads):
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def affine(t, shape):
    """(packed uint32, scales, biases, bits) of a Q4_0/Q4_1/Q8_0 tensor."""
    raw = np.asarray(t.data).reshape(-1)
    size = {T.Q4_0: 18, T.Q4_1: 20, T.Q8_0: 34}[t.tensor_type]
    blocks = raw.reshape(-1, size)
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0]
    if t.tensor_type == T.Q8_0:
        codes = (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint32)  # int8 → 0..255
        bias, bits = (d.astype(np.float32) * -128).astype(np.float16), 8
    else:
        qs = blocks[:, -16:]
        codes = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.uint32)
        if t.tensor_type == T.Q4_1:
            bias = blocks[:, 2:4].copy().view(np.float16)[:, 0]
        else:
            bias = (d.astype(np.float32) * -8).astype(np.float16)
        bits = 4
    per = 32 // bits
    codes = codes.reshape(-1, per)
    words = np.zeros(codes.shape[0], dtype=np.uint32)
    for k in range(per):
        words |= codes[:, k] << np.uint32(bits * k)
    rows, cols = shape
    return (words.reshape(rows, cols * bits // 32), d.reshape(rows, cols // 32),
            bias.reshape(rows, cols // 32), bits)


def main():
    src, out, question, max_tokens = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    out.mkdir(parents=True, exist_ok=True)
    r = GGUFReader(src)
    field = lambda k: r.fields[k].contents() if k in r.fields else None
    assert field("general.architecture") == "llama"
    heads, kv_heads = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    arrays, quant = {}, {"group_size": 32, "bits": 4}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        name = hf_name(t.name)
        perm = heads if ".q_proj." in name else kv_heads if ".k_proj." in name else None
        if t.tensor_type in (T.Q4_0, T.Q4_1, T.Q8_0):
            w, s, b, bits = affine(t, shape)
            if perm:
                w, s, b = unpermute(w, perm), unpermute(s, perm), unpermute(b, perm)
            stem = name[: -len(".weight")]
            arrays[name], arrays[f"{stem}.scales"], arrays[f"{stem}.biases"] = mx.array(w), mx.array(s), mx.array(b)
            if bits != 4:
                quant[stem] = {"group_size": 32, "bits": bits}
        elif t.tensor_type in (T.F32, T.F16):
            a = np.asarray(t.data).reshape(shape)
            arrays[name] = mx.array(unpermute(a, perm) if perm else a)
        else:
            sys.exit(f"{t.name}: {t.tensor_type.name} is not written by this tool")
    mx.save_safetensors(str(out / "model.safetensors"), arrays, metadata={"format": "mlx"})

    A = lambda k, d=None: field(f"llama.{k}") if field(f"llama.{k}") is not None else d
    tok = lambda k: field(f"tokenizer.ggml.{k}")
    hidden = A("embedding_length")
    config = {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": A("block_count"),
              "intermediate_size": A("feed_forward_length"), "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": A("rope.dimension_count", hidden // heads),
              "rms_norm_eps": A("attention.layer_norm_rms_epsilon"), "vocab_size": len(tok("tokens")),
              "rope_theta": A("rope.freq_base", 10000.0), "max_position_embeddings": A("context_length"),
              "tie_word_embeddings": "lm_head.weight" not in arrays, "eos_token_id": tok("eos_token_id"),
              "quantization": quant}
    (out / "config.json").write_text(json.dumps(config, indent=2))

    # The GPT-2-style BPE as tokenizer.json (SmolLM2's "smollm" pre-tokenizer:
    # every digit alone, then GPT-2's split).
    vocab, types, merges = tok("tokens"), tok("token_type"), tok("merges")
    assert tok("model") == "gpt2" and tok("pre") == "smollm", (tok("model"), tok("pre"))
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "added_tokens": [{"id": i, "content": v, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, v in enumerate(vocab) if types[i] == 3],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]},
        "post_processor": dict(byte_level, trim_offsets=False), "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {v: i for i, v in enumerate(vocab)}, "merges": [m.split(" ", 1) for m in merges]},
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": vocab[tok("bos_token_id")],
        "eos_token": vocab[tok("eos_token_id")], "pad_token": vocab[tok("padding_token_id")],
        "chat_template": field("tokenizer.chat_template"), "add_bos_token": False}, indent=2))

    from mlx_lm import load
    from mlx_lm.generate import generate_step
    model, tokenizer = load(str(out))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    tokens = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens, sampler=lambda lp: mx.argmax(lp, axis=-1)):
        tokens.append(int(token))
        if int(token) in tokenizer.eos_token_ids:
            break
    (out / "reference.json").write_text(json.dumps({"prompt": list(prompt), "tokens": tokens,
                                                    "text": tokenizer.decode(tokens)}))


if __name__ == "__main__":
    main()
