//! Qwen3: Llama with an explicit head_dim and per-head RMS norms on queries and
//! keys; rope settings may sit under `rope_parameters` (transformers ≥ 5).

use serde::Deserialize;
use serde_json::Value;

use super::attention::{AttentionSpec, QkNorm};
use super::dense::DenseSpec;
use crate::error::{Error, Result};

#[derive(Debug, Deserialize)]
pub struct Qwen3Config {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub tie_word_embeddings: bool,
    pub rope_theta: Option<f32>,
    pub rope_scaling: Option<Value>,
    pub rope_parameters: Option<Value>,
}

impl Qwen3Config {
    pub fn spec(&self) -> Result<DenseSpec> {
        let params = self.rope_parameters.as_ref();
        let theta = self
            .rope_theta
            .or_else(|| params.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64).map(|v| v as f32))
            .ok_or_else(|| Error::ModelFile {
                file: "config.json".into(),
                message: "rope_theta is missing from the model config".into(),
            })?;
        Ok(DenseSpec {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            attention: AttentionSpec {
                n_heads: self.num_attention_heads,
                n_kv_heads: self.num_key_value_heads,
                head_dim: self.head_dim,
                qkv_bias: false,
                o_bias: false,
                qk_norm: QkNorm::PerHead(self.rms_norm_eps),
                scale: None,
                fused_qkv: false,
            },
            mlp_bias: false,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: theta,
            rope_traditional: false,
            rope_scaling: self.rope_scaling.clone().or_else(|| self.rope_parameters.clone()),
            rope_dims: None,
            su_rope_positions: None,
            fused_gate_up: false,
            tie_word_embeddings: self.tie_word_embeddings,
            moe: None,
            moe_layers: Vec::new(),
            moe_module: "mlp",
        })
    }
}
