//! The tiny model configurations of the parity tests (config.json fields),
//! shared by every test that builds a fixture of one family.

use serde_json::{json, Value};

/// A fixture spec: `config`, weights in `dtype`, optionally quantized; a
/// 600-token prompt (two prefill chunks of 512) and 64 greedy tokens.
pub fn spec(config: Value, dtype: &str, quantize: Option<Value>) -> Value {
    json!({"config": config, "dtype": dtype, "quantize": quantize, "prompt_tokens": 600,
           "max_tokens": 64, "prefill_size": 512, "seed": 0})
}

pub fn llama() -> Value {
    json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 512,
           "rope_theta": 10000.0, "tie_word_embeddings": false, "max_position_embeddings": 2048})
}

pub fn qwen2(tie_word_embeddings: bool) -> Value {
    json!({"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 512,
           "rope_theta": 1000000.0, "tie_word_embeddings": tie_word_embeddings, "max_position_embeddings": 2048})
}

pub fn qwen3(head_dim: i64, tie_word_embeddings: bool) -> Value {
    json!({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": head_dim, "rms_norm_eps": 1e-6,
           "vocab_size": 512, "rope_theta": 1000000.0, "tie_word_embeddings": tie_word_embeddings,
           "max_position_embeddings": 2048})
}

pub fn qwen3_moe() -> Value {
    json!({"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
           "vocab_size": 512, "rope_theta": 1000000.0, "tie_word_embeddings": false,
           "max_position_embeddings": 2048, "num_experts": 8, "num_experts_per_tok": 2,
           "decoder_sparse_step": 1, "mlp_only_layers": [], "moe_intermediate_size": 64,
           "norm_topk_prob": true})
}

pub fn mixtral() -> Value {
    json!({"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 512,
           "num_local_experts": 6, "num_experts_per_tok": 2, "rope_theta": 1000000.0})
}

pub fn qwen2_moe() -> Value {
    json!({"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 512,
           "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
           "shared_expert_intermediate_size": 96, "tie_word_embeddings": false})
}

pub fn olmoe() -> Value {
    json!({"model_type": "olmoe", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "vocab_size": 512,
           "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": false,
           "tie_word_embeddings": false})
}

/// gpt-oss: 4 layers, sliding (window 128, shorter than the 600-token prompt)
/// and full alternating, sinks, biases everywhere, YaRN rope whose ramp spans
/// several of the 8 frequency pairs.
pub fn gpt_oss() -> Value {
    json!({"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
           "vocab_size": 512, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 128,
           "rope_theta": 150000, "max_position_embeddings": 131072,
           "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                            "original_max_position_embeddings": 4096, "truncate": false},
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]})
}

/// Gemma 4 (E2B-like): 6 layers, sliding (window 128) and full (every 3rd,
/// head size 64 against 32, proportional partial rope), the last 2 sharing the
/// keys and values of layers 3 and 2, per-layer inputs, double-wide MLPs on the
/// shared layers, soft-capped logits.
pub fn gemma4() -> Value {
    json!({"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 6, "intermediate_size": 128,
           "num_attention_heads": 4, "head_dim": 32, "global_head_dim": 64, "num_key_value_heads": 2,
           "rms_norm_eps": 1e-6, "vocab_size": 512, "vocab_size_per_layer_input": 512, "num_kv_shared_layers": 2,
           "hidden_size_per_layer_input": 16, "sliding_window": 128, "sliding_window_pattern": 3,
           "final_logit_softcapping": 30.0, "use_double_wide_mlp": true, "max_position_embeddings": 4096,
           "tie_word_embeddings": true})
}

/// Gemma 4's MoE block (26B-A4B-like): a MoE beside every MLP, values equal to
/// keys on full layers (one global KV head), no per-layer inputs or KV sharing.
pub fn gemma4_moe() -> Value {
    json!({"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 64,
           "num_attention_heads": 4, "head_dim": 32, "global_head_dim": 64, "num_key_value_heads": 2,
           "num_global_key_value_heads": 1, "attention_k_eq_v": true, "rms_norm_eps": 1e-6, "vocab_size": 512,
           "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0, "sliding_window": 128,
           "sliding_window_pattern": 2, "final_logit_softcapping": 30.0, "enable_moe_block": true, "num_experts": 8,
           "top_k_experts": 2, "moe_intermediate_size": 32, "max_position_embeddings": 4096, "tie_word_embeddings": true})
}

pub fn gemma3() -> Value {
    json!({"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "rms_norm_eps": 1e-6,
           "vocab_size": 512, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
           "query_pre_attn_scalar": 32, "sliding_window": 128, "sliding_window_pattern": 2,
           "max_position_embeddings": 2048})
}

pub fn phi3(rope_scaling: Value, partial: f64) -> Value {
    json!({"model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 512,
           "rope_theta": 10000.0, "rope_scaling": rope_scaling, "partial_rotary_factor": partial,
           "max_position_embeddings": 8192, "original_max_position_embeddings": 512,
           "tie_word_embeddings": false})
}

/// Phi-3's longrope: 16 long factors rising from 1 (the input scale is not 1,
/// as 8192 > 512 positions).
pub fn phi3_longrope() -> Value {
    let factors: Vec<f64> = (0..16).map(|i| 1.0 + i as f64 * 0.25).collect();
    phi3(json!({"type": "longrope", "short_factor": vec![1.0; 16], "long_factor": factors}), 1.0)
}

/// A Qwen3-MoE with many small experts (64, top-4): what expert streaming is
/// for, at a size the CI machine runs.
pub fn qwen3_moe_many_experts() -> Value {
    let mut c = qwen3_moe();
    c["num_experts"] = json!(64);
    c["num_experts_per_tok"] = json!(4);
    c
}

/// Qwen3-Next: Gated DeltaNet layers with a gated full-attention layer every
/// second one, MoE with a shared expert but on `mlp_only_layers`.
pub fn qwen3_next() -> Value {
    json!({"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
           "vocab_size": 512, "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
           "max_position_embeddings": 2048, "tie_word_embeddings": false,
           "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 32,
           "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
           "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [1],
           "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "norm_topk_prob": true})
}

/// Qwen3.5's text model (as its `text_config`): separate linear-attention
/// projections, rope from `rope_parameters` (multimodal sections, which text
/// ignores), a full-attention layer every fourth.
pub fn qwen3_5_text() -> Value {
    json!({"model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
           "vocab_size": 512, "max_position_embeddings": 2048, "tie_word_embeddings": true,
           "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 32,
           "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                               "mrope_section": [2, 1, 1], "mrope_interleaved": true}})
}

/// A `qwen3_5` checkpoint (text model inside, as published).
pub fn qwen3_5() -> Value {
    json!({"model_type": "qwen3_5", "text_config": qwen3_5_text(), "tie_word_embeddings": true, "vocab_size": 512})
}

/// A `qwen3_5_moe` checkpoint: MoE with a shared expert on every layer.
pub fn qwen3_5_moe() -> Value {
    let mut text = qwen3_5_text();
    text["model_type"] = json!("qwen3_5_moe_text");
    text["tie_word_embeddings"] = json!(false);
    for (k, v) in [("num_experts", 8), ("num_experts_per_tok", 2), ("moe_intermediate_size", 32), ("shared_expert_intermediate_size", 32)] {
        text[k] = json!(v);
    }
    json!({"model_type": "qwen3_5_moe", "text_config": text, "tie_word_embeddings": false, "vocab_size": 512})
}
