//! Llama 2/3.x (llama3 rope scaling included), Mistral, SmolLM, TinyLlama:
//! the plain decoder.

use super::config::{ConfigFile, DecoderConfig, Defaults};
use super::decoder::DecoderSpec;
use crate::error::Result;

pub fn spec(config: &ConfigFile) -> Result<DecoderSpec> {
    let base: DecoderConfig = config.parse()?;
    base.spec(config, Defaults { rope_theta: Some(10_000.0), tie_word_embeddings: Some(true) })
}
