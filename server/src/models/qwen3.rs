//! Qwen3: Llama with an explicit head_dim and per-head RMS norms on queries and
//! keys, no biases; rope settings may sit under `rope_parameters` (transformers ≥ 5).

use serde::Deserialize;

use super::attention::QkNorm;
use super::config::{ConfigFile, DecoderConfig, Defaults, RopeScaling};
use super::decoder::DecoderSpec;
use crate::error::Result;

#[derive(Debug, Deserialize)]
struct Qwen3Fields {
    head_dim: i32,
    rope_parameters: Option<RopeParameters>,
}

#[derive(Debug, Deserialize)]
struct RopeParameters {
    rope_theta: Option<f32>,
}

pub fn spec(config: &ConfigFile) -> Result<DecoderSpec> {
    let mut base: DecoderConfig = config.parse()?;
    let fields: Qwen3Fields = config.parse()?;
    base.head_dim = Some(fields.head_dim);
    base.rope_theta = base.rope_theta.or(fields.rope_parameters.and_then(|p| p.rope_theta));
    let half = (fields.head_dim / 2) as usize;
    let scaling = match config.value.get("rope_scaling") {
        Some(v) if !v.is_null() => RopeScaling::read(config, "rope_scaling", half, None)?,
        _ => RopeScaling::read(config, "rope_parameters", half, None)?,
    };
    let mut spec = base.spec_with_rope(config, Defaults { rope_theta: None, tie_word_embeddings: None }, fields.head_dim, scaling)?;
    spec.attention.qkv_bias = false;
    spec.attention.o_bias = false;
    spec.attention.qk_norm = QkNorm::PerHead(base.rms_norm_eps);
    spec.mlp_bias = false;
    spec.rope.traditional = false;
    Ok(spec)
}
