//! OLMoE: Llama-style attention with RMS norms over the whole q and k
//! projections, and a sparse MoE on every layer, routed over a flat token view.

use serde::Deserialize;

use super::attention::QkNorm;
use super::config::{ConfigFile, DecoderConfig, Defaults};
use super::decoder::DecoderSpec;
use super::moe::{MoeParts, MoeSpec, Router, HF_GLU_NAMES};
use crate::error::Result;

#[derive(Debug, Deserialize)]
struct MoeFields {
    num_experts: i32,
    num_experts_per_tok: i32,
    #[serde(default)]
    norm_topk_prob: bool,
}

pub fn spec(config: &ConfigFile) -> Result<DecoderSpec> {
    let base: DecoderConfig = config.parse()?;
    let mut spec = base.spec(config, Defaults { rope_theta: Some(10_000.0), tie_word_embeddings: Some(true) })?;
    let m: MoeFields = config.parse()?;
    spec.attention.qk_norm = QkNorm::Full(base.rms_norm_eps);
    spec.moe_layers = vec![true; spec.num_layers as usize];
    spec.moe = Some(MoeSpec {
        num_experts: m.num_experts,
        top_k: m.num_experts_per_tok,
        expert_hidden: spec.intermediate_size,
        norm_topk_prob: m.norm_topk_prob,
        router: Router::SoftmaxTopKFirst,
        shared_expert_hidden: None,
        hf_expert_names: HF_GLU_NAMES,
        flatten_tokens: true,
        module: "mlp",
        parts: MoeParts::STANDARD,
    });
    Ok(spec)
}
