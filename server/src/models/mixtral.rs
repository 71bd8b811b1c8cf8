//! Mixtral: Llama attention, and every layer's feed-forward a sparse MoE
//! (`block_sparse_moe`) routed top-k on the logits, softmax over the chosen.

use serde::Deserialize;
use serde_json::Value;

use super::attention::{AttentionSpec, QkNorm};
use super::dense::DenseSpec;
use super::moe::{MoeSpec, Router};

#[derive(Debug, Deserialize)]
pub struct MixtralConfig {
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub intermediate_size: i32,
    pub num_hidden_layers: i32,
    pub num_attention_heads: i32,
    pub num_experts_per_tok: i32,
    pub num_key_value_heads: Option<i32>,
    pub num_local_experts: i32,
    pub rms_norm_eps: f32,
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

impl MixtralConfig {
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
                qkv_bias: false,
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
                num_experts: self.num_local_experts,
                top_k: self.num_experts_per_tok,
                expert_hidden: self.intermediate_size,
                norm_topk_prob: false,
                router: Router::TopKThenSoftmax,
                shared_expert_hidden: None,
                hf_expert_names: [("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")],
                flatten_tokens: false,
            }),
            moe_layers: vec![true; self.num_hidden_layers as usize],
            moe_module: "block_sparse_moe",
        }
    }
}
