//! Llama 2/3.x (llama3 rope scaling included), Mistral, SmolLM, TinyLlama.

use serde::Deserialize;
use serde_json::Value;

use super::attention::{AttentionSpec, QkNorm};
use super::dense::DenseSpec;

#[derive(Debug, Deserialize)]
pub struct LlamaConfig {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub head_dim: Option<i32>,
    pub num_key_value_heads: Option<i32>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    pub rope_scaling: Option<Value>,
    #[serde(default = "yes")]
    pub tie_word_embeddings: bool,
}

fn default_theta() -> f32 {
    10000.0
}

fn yes() -> bool {
    true
}

impl LlamaConfig {
    pub fn spec(&self) -> DenseSpec {
        DenseSpec {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            attention: AttentionSpec {
                n_heads: self.num_attention_heads,
                n_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
                head_dim: self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads),
                qkv_bias: self.attention_bias,
                o_bias: self.attention_bias,
                qk_norm: QkNorm::None,
                scale: None,
                fused_qkv: false,
            },
            mlp_bias: self.mlp_bias,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            rope_traditional: self.rope_traditional,
            rope_scaling: self.rope_scaling.clone(),
            rope_dims: None,
            su_rope_positions: None,
            fused_gate_up: false,
            tie_word_embeddings: self.tie_word_embeddings,
            moe: None,
            moe_layers: Vec::new(),
            moe_module: "mlp",
        }
    }
}
