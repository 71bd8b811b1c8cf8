//! Phi-3 / Phi-3.5: fused qkv and gate_up projections, partial rotary
//! embeddings and "su"/"longrope" rope scaling.

use serde::Deserialize;

use super::config::{ConfigFile, DecoderConfig, Defaults, RopeScaling};
use super::decoder::DecoderSpec;
use crate::error::Result;

#[derive(Debug, Deserialize)]
struct Phi3Fields {
    #[serde(default = "one")]
    partial_rotary_factor: f32,
    #[serde(default = "default_max_pos")]
    max_position_embeddings: i32,
    #[serde(default = "default_orig_max_pos")]
    original_max_position_embeddings: i32,
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

pub fn spec(config: &ConfigFile) -> Result<DecoderSpec> {
    let mut base: DecoderConfig = config.parse()?;
    let f: Phi3Fields = config.parse()?;
    base.head_dim = None;
    base.attention_bias = false;
    base.mlp_bias = false;
    let rope_dims = (base.head_dim() as f32 * f.partial_rotary_factor) as i32;
    let kind = config
        .value
        .get("rope_scaling")
        .and_then(|s| s.get("type").or_else(|| s.get("rope_type")))
        .and_then(|t| t.as_str());
    // mlx-lm drops scaling types other than these (with a warning).
    let scaling = match kind {
        Some("su" | "longrope" | "linear") => RopeScaling::read(
            config,
            "rope_scaling",
            (rope_dims / 2) as usize,
            Some((f.max_position_embeddings, f.original_max_position_embeddings)),
        )?,
        _ => RopeScaling::Default,
    };
    let mut spec = base.spec_with_rope(config, Defaults { rope_theta: Some(10_000.0), tie_word_embeddings: Some(false) }, rope_dims, scaling)?;
    spec.attention.fused_qkv = true;
    spec.fused_gate_up = true;
    Ok(spec)
}
