//! Phi-3 / Phi-3.5: fused qkv and gate_up projections, partial rotary
//! embeddings and "su"/"longrope" rope scaling.

use serde::Deserialize;
use serde_json::Value;

use super::attention::{AttentionSpec, QkNorm};
use super::dense::DenseSpec;
use crate::error::{Error, Result};

#[derive(Debug, Deserialize)]
pub struct Phi3Config {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub num_key_value_heads: Option<i32>,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    pub rope_scaling: Option<Value>,
    #[serde(default = "one")]
    pub partial_rotary_factor: f32,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: i32,
    #[serde(default = "default_orig_max_pos")]
    pub original_max_position_embeddings: i32,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_theta() -> f32 {
    10000.0
}
fn one() -> f32 {
    1.0
}
fn default_max_pos() -> i32 {
    131_072
}
fn default_orig_max_pos() -> i32 {
    4096
}

impl Phi3Config {
    pub fn spec(&self) -> Result<DenseSpec> {
        let head_dim = self.hidden_size / self.num_attention_heads;
        let scaling_type = self
            .rope_scaling
            .as_ref()
            .and_then(|s| s.get("type").or_else(|| s.get("rope_type")))
            .and_then(Value::as_str);
        // mlx-lm drops scaling types other than these (with a warning).
        let (rope_scaling, su) = match scaling_type {
            Some("su") | Some("longrope") => {
                if self.rope_scaling.as_ref().and_then(|s| s.get("long_factor")).is_none() {
                    return Err(Error::ModelFile {
                        file: "config.json".into(),
                        message: "rope_scaling must contain long_factor".into(),
                    });
                }
                (self.rope_scaling.clone(), Some((self.max_position_embeddings, self.original_max_position_embeddings)))
            }
            Some("linear") => (self.rope_scaling.clone(), None),
            _ => (None, None),
        };
        Ok(DenseSpec {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            attention: AttentionSpec {
                n_heads: self.num_attention_heads,
                n_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
                head_dim,
                qkv_bias: false,
                o_bias: false,
                qk_norm: QkNorm::None,
                scale: None,
                fused_qkv: true,
            },
            mlp_bias: false,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            rope_traditional: self.rope_traditional,
            rope_scaling,
            rope_dims: Some((head_dim as f32 * self.partial_rotary_factor) as i32),
            su_rope_positions: su,
            fused_gate_up: true,
            tie_word_embeddings: self.tie_word_embeddings,
            moe: None,
            moe_layers: Vec::new(),
            moe_module: "mlp",
        })
    }
}
