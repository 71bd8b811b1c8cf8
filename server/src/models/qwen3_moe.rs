//! Qwen3-MoE (e.g. Qwen3-30B-A3B): Qwen3 attention, and a sparse MoE
//! feed-forward on every `decoder_sparse_step`-th layer not in `mlp_only_layers`.

use serde::Deserialize;

use super::config::ConfigFile;
use super::decoder::DecoderSpec;
use super::moe::{MoeParts, MoeSpec, Router, HF_GLU_NAMES};
use crate::error::Result;

#[derive(Debug, Deserialize)]
struct MoeFields {
    num_experts: i32,
    num_experts_per_tok: i32,
    decoder_sparse_step: i32,
    #[serde(default)]
    mlp_only_layers: Vec<i32>,
    moe_intermediate_size: i32,
    norm_topk_prob: bool,
}

pub fn spec(config: &ConfigFile) -> Result<DecoderSpec> {
    let mut spec = super::qwen3::spec(config)?;
    let m: MoeFields = config.parse()?;
    spec.moe_layers = (0..spec.num_layers)
        .map(|i| !m.mlp_only_layers.contains(&i) && m.num_experts > 0 && m.decoder_sparse_step > 0 && (i + 1) % m.decoder_sparse_step == 0)
        .collect();
    spec.moe = Some(MoeSpec {
        num_experts: m.num_experts,
        top_k: m.num_experts_per_tok,
        expert_hidden: m.moe_intermediate_size,
        norm_topk_prob: m.norm_topk_prob,
        router: Router::SoftmaxTopKLast,
        shared_expert_hidden: None,
        hf_expert_names: HF_GLU_NAMES,
        flatten_tokens: false,
        module: "mlp",
        parts: MoeParts::STANDARD,
    });
    Ok(spec)
}
