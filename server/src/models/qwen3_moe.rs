//! Qwen3-MoE (e.g. Qwen3-30B-A3B): Qwen3 attention, and a sparse MoE
//! feed-forward on every `decoder_sparse_step`-th layer not in `mlp_only_layers`.

use serde::Deserialize;
use serde_json::Value;

use super::attention::{AttentionSpec, QkNorm};
use super::dense::DenseSpec;
use super::moe::{MoeSpec, Router, HF_GLU_NAMES};

#[derive(Debug, Deserialize)]
pub struct Qwen3MoeConfig {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_experts: i32,
    pub num_experts_per_tok: i32,
    pub decoder_sparse_step: i32,
    #[serde(default)]
    pub mlp_only_layers: Vec<i32>,
    pub moe_intermediate_size: i32,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub num_key_value_heads: i32,
    pub head_dim: i32,
    pub rope_theta: f32,
    pub tie_word_embeddings: bool,
    pub norm_topk_prob: bool,
    pub rope_scaling: Option<Value>,
}

impl Qwen3MoeConfig {
    pub fn spec(&self) -> DenseSpec {
        let moe_layers = (0..self.num_hidden_layers)
            .map(|i| {
                !self.mlp_only_layers.contains(&i)
                    && self.num_experts > 0
                    && self.decoder_sparse_step > 0
                    && (i + 1) % self.decoder_sparse_step == 0
            })
            .collect();
        DenseSpec {
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
            rope_theta: self.rope_theta,
            rope_traditional: false,
            rope_scaling: self.rope_scaling.clone(),
            rope_dims: None,
            su_rope_positions: None,
            fused_gate_up: false,
            tie_word_embeddings: self.tie_word_embeddings,
            moe: Some(MoeSpec {
                num_experts: self.num_experts,
                top_k: self.num_experts_per_tok,
                expert_hidden: self.moe_intermediate_size,
                norm_topk_prob: self.norm_topk_prob,
                router: Router::SoftmaxTopKLast,
                shared_expert_hidden: None,
                hf_expert_names: HF_GLU_NAMES,
                flatten_tokens: false,
            }),
            moe_layers,
            moe_module: "mlp",
        }
    }
}
