//! Qwen2-MoE (e.g. Qwen1.5-MoE-A2.7B): Qwen2 attention (q/k/v bias), sparse MoE
//! on every layer plus a shared expert gated by sigmoid.

use serde::Deserialize;

use super::config::{ConfigFile, Defaults};
use super::decoder::DecoderSpec;
use super::moe::{MoeParts, MoeSpec, Router, HF_GLU_NAMES};
use crate::error::Result;

#[derive(Debug, Deserialize)]
struct MoeFields {
    num_experts: i32,
    num_experts_per_tok: i32,
    moe_intermediate_size: i32,
    shared_expert_intermediate_size: i32,
}

pub fn spec(config: &ConfigFile) -> Result<DecoderSpec> {
    let mut spec = super::qwen2::spec_with(config, Defaults { tie_word_embeddings: Some(false), ..super::qwen2::DEFAULTS })?;
    let m: MoeFields = config.parse()?;
    spec.moe_layers = vec![true; spec.num_layers as usize];
    spec.moe = Some(MoeSpec {
        num_experts: m.num_experts,
        top_k: m.num_experts_per_tok,
        expert_hidden: m.moe_intermediate_size,
        norm_topk_prob: false,
        router: Router::SoftmaxTopKFirst,
        shared_expert_hidden: Some(m.shared_expert_intermediate_size),
        hf_expert_names: HF_GLU_NAMES,
        flatten_tokens: false,
        module: "mlp",
        parts: MoeParts::STANDARD,
    });
    Ok(spec)
}
