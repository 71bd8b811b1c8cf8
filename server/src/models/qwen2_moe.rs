//! Qwen2-MoE (e.g. Qwen1.5-MoE-A2.7B): Qwen2 attention (q/k/v bias), sparse MoE
//! on every layer plus a shared expert gated by sigmoid.

use serde::Deserialize;
use serde_json::Value;

use super::attention::{AttentionSpec, QkNorm};
use super::dense::DenseSpec;
use super::moe::{MoeSpec, Router, HF_GLU_NAMES};

#[derive(Debug, Deserialize)]
pub struct Qwen2MoeConfig {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_experts: i32,
    pub moe_intermediate_size: i32,
    pub shared_expert_intermediate_size: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub num_key_value_heads: Option<i32>,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    pub rope_scaling: Option<Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

fn default_theta() -> f32 {
    1_000_000.0
}

impl Qwen2MoeConfig {
    pub fn spec(&self) -> DenseSpec {
        DenseSpec {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            attention: AttentionSpec {
                n_heads: self.num_attention_heads,
                n_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
                head_dim: self.hidden_size / self.num_attention_heads,
                qkv_bias: true,
                o_bias: false,
                qk_norm: QkNorm::None,
                scale: None,
                fused_qkv: false,
            },
            mlp_bias: false,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            rope_traditional: self.rope_traditional,
            rope_scaling: self.rope_scaling.clone(),
            rope_dims: None,
            su_rope_positions: None,
            fused_gate_up: false,
            tie_word_embeddings: self.tie_word_embeddings,
            moe: Some(MoeSpec {
                num_experts: self.num_experts,
                top_k: self.num_experts_per_tok,
                expert_hidden: self.moe_intermediate_size,
                norm_topk_prob: false,
                router: Router::SoftmaxTopKFirst,
                shared_expert_hidden: Some(self.shared_expert_intermediate_size),
                hf_expert_names: HF_GLU_NAMES,
                flatten_tokens: false,
            }),
            moe_layers: vec![true; self.num_hidden_layers as usize],
            moe_module: "mlp",
        }
    }
}
