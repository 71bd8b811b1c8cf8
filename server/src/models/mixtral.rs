//! Mixtral: Llama attention, and every layer's feed-forward a sparse MoE
//! (`block_sparse_moe`) routed top-k on the logits, softmax over the chosen.

use serde::Deserialize;

use super::config::{ConfigFile, DecoderConfig, Defaults};
use super::decoder::DecoderSpec;
use super::moe::{MoeParts, MoeSpec, Router};
use crate::error::Result;

#[derive(Debug, Deserialize)]
struct MoeFields {
    num_local_experts: i32,
    num_experts_per_tok: i32,
}

pub fn spec(config: &ConfigFile) -> Result<DecoderSpec> {
    let mut base: DecoderConfig = config.parse()?;
    // mlx-lm's Mixtral derives the head size and has no biases.
    base.head_dim = None;
    base.attention_bias = false;
    base.mlp_bias = false;
    let mut spec = base.spec(config, Defaults { rope_theta: Some(1_000_000.0), tie_word_embeddings: Some(false) })?;
    let m: MoeFields = config.parse()?;
    spec.moe_layers = vec![true; spec.num_layers as usize];
    spec.moe = Some(MoeSpec {
        num_experts: m.num_local_experts,
        top_k: m.num_experts_per_tok,
        expert_hidden: spec.intermediate_size,
        norm_topk_prob: false,
        router: Router::TopKThenSoftmax,
        shared_expert_hidden: None,
        hf_expert_names: [("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")],
        flatten_tokens: false,
        module: "block_sparse_moe",
        parts: MoeParts::STANDARD,
    });
    Ok(spec)
}
