//! Qwen2 / Qwen2.5: Llama with biases on the q/k/v projections (not the output).

use super::config::{ConfigFile, DecoderConfig, Defaults};
use super::decoder::DecoderSpec;
use crate::error::Result;

/// mlx-lm's defaults for Qwen2.
pub const DEFAULTS: Defaults = Defaults { rope_theta: Some(1_000_000.0), tie_word_embeddings: Some(true) };

/// The Qwen2 decoder with the given defaults (Qwen2-MoE's differ).
pub fn spec_with(config: &ConfigFile, defaults: Defaults) -> Result<DecoderSpec> {
    let mut base: DecoderConfig = config.parse()?;
    // mlx-lm's Qwen2 always derives the head size.
    base.head_dim = None;
    let mut spec = base.spec(config, defaults)?;
    spec.attention.qkv_bias = true;
    spec.attention.o_bias = false;
    spec.mlp_bias = false;
    Ok(spec)
}

pub fn spec(config: &ConfigFile) -> Result<DecoderSpec> {
    spec_with(config, DEFAULTS)
}
