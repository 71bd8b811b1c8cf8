//! The tiny random-weight Qwen3 models the server tests run (built once by
//! mlx-lm, see `fixture`).

use std::path::PathBuf;

use serde_json::json;

/// A tiny float32 Qwen3 (float32: batched and single decoding agree exactly on CPU).
pub fn model() -> PathBuf {
    model_with_context("server_qwen3", 2048)
}

/// The same shape with a context long enough for streams that outlast a test.
pub fn long_context_model() -> PathBuf {
    model_with_context("server_qwen3_long", 1 << 24)
}

pub fn model_with_context(name: &str, context: u64) -> PathBuf {
    qwen3_fixture(name, context, 16)
}

/// Heads of 32: MLX quantizes in groups of at least 32, so --kv-bits needs them.
pub fn quantizable_kv_model() -> PathBuf {
    qwen3_fixture("server_qwen3_hd32", 2048, 32)
}

pub fn qwen3_fixture(name: &str, context: u64, head_dim: u64) -> PathBuf {
    let config = json!({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": head_dim, "rms_norm_eps": 1e-6,
                        "vocab_size": 512, "rope_theta": 1000000.0, "tie_word_embeddings": true,
                        "max_position_embeddings": context});
    super::fixture(name, &json!({"config": config, "dtype": "float32", "quantize": null,
                                 "prompt_tokens": 8, "max_tokens": 4, "seed": 5}))
}

/// A Qwen3-style thinking template (as a chat_template.jinja beside the model,
/// which wins over tokenizer_config.json): the assistant turn opens a
/// `<think>` block unless `enable_thinking` is false, which closes it at once.
pub const THINKING_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}\
<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";
