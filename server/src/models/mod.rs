//! Model architectures over shared building blocks, and the registry from
//! config.json's `model_type` to a loaded model.

mod attention;
mod dense;
mod gemma3_text;
mod layers;
mod llama;
mod mixtral;
mod mlp;
mod moe;
mod phi3;
mod olmoe;
pub mod quant;
mod qwen2;
mod qwen2_moe;
mod qwen3;
mod qwen3_moe;
mod rope;
mod switch;
pub mod weights;

use std::path::Path;

use mlx_rs_safe::Array;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::kv::{KvKind, ModelCache};
use quant::QuantConfig;
use weights::Weights;

/// A causal language model: token ids in, logits out, state in a KV cache.
pub trait LanguageModel: Send {
    /// `tokens`: [B, L] int32 → logits [B, L, vocab], for the B sequences of
    /// `cache`, whose keys and values it appends.
    fn forward(&self, tokens: &Array, cache: &mut ModelCache) -> Result<Array>;
    /// Each layer's cache kind (dense, or a rotating window).
    fn cache_kinds(&self) -> Vec<KvKind>;
    /// The attention head dimension (what a KV quantization group must divide).
    fn head_dim(&self) -> i32;
}

/// `model_type`s this build can load (mistral maps to llama, as in mlx-lm).
pub const SUPPORTED: &[&str] = &["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gemma3_text", "phi3"];

fn parse<T: DeserializeOwned>(config: &Value, path: &Path) -> Result<T> {
    serde_json::from_value(config.clone()).map_err(|e| Error::model_file(path, format!("invalid config: {e}")))
}

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Quantize an unquantized model at load (`--quantize`), as mlx_lm.convert would.
    pub quantize: Option<quant::QuantParams>,
}

/// Loads the model in folder `dir` (config.json + safetensors).
pub fn load(dir: &Path) -> Result<(Box<dyn LanguageModel>, Value)> {
    load_with(dir, &LoadOptions::default())
}

/// [`load`] with options.
pub fn load_with(dir: &Path, opts: &LoadOptions) -> Result<(Box<dyn LanguageModel>, Value)> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| Error::model_file(&config_path, format!("cannot read: {e}")))?;
    let config: Value =
        serde_json::from_str(&text).map_err(|e| Error::model_file(&config_path, format!("invalid JSON: {e}")))?;
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::model_file(&config_path, "missing field `model_type`"))?;
    let mut quant = QuantConfig::from_config(&config)?;
    let mut weights = Weights::load(dir)?;
    if let Some(q) = opts.quantize {
        if quant.is_quantized() {
            return Err(Error::InvalidRequest(format!(
                "{} is already quantized; --quantize applies to float models",
                dir.display()
            )));
        }
        if ![2, 3, 4, 5, 6, 8].contains(&q.bits) || ![32, 64, 128].contains(&q.group_size) {
            return Err(Error::InvalidRequest(format!(
                "--quantize needs bits in 2, 3, 4, 5, 6, 8 and a group size of 32, 64 or 128 (got {} bits, group {})",
                q.bits, q.group_size
            )));
        }
        weights.quantize_in_place(q.group_size, q.bits)?;
        quant = QuantConfig::uniform(q);
    }
    let model: Box<dyn LanguageModel> = match model_type {
        "llama" | "mistral" => {
            let c: llama::LlamaConfig = parse(&config, &config_path)?;
            Box::new(dense::DenseDecoder::load(&c.spec(), weights, &quant)?)
        }
        "qwen2" => {
            let c: qwen2::Qwen2Config = parse(&config, &config_path)?;
            Box::new(dense::DenseDecoder::load(&c.spec(), weights, &quant)?)
        }
        "qwen3" => {
            let c: qwen3::Qwen3Config = parse(&config, &config_path)?;
            Box::new(dense::DenseDecoder::load(&c.spec()?, weights, &quant)?)
        }
        "qwen3_moe" => {
            let c: qwen3_moe::Qwen3MoeConfig = parse(&config, &config_path)?;
            Box::new(dense::DenseDecoder::load(&c.spec(), weights, &quant)?)
        }
        "qwen2_moe" => {
            let c: qwen2_moe::Qwen2MoeConfig = parse(&config, &config_path)?;
            Box::new(dense::DenseDecoder::load(&c.spec(), weights, &quant)?)
        }
        "mixtral" => {
            let c: mixtral::MixtralConfig = parse(&config, &config_path)?;
            Box::new(dense::DenseDecoder::load(&c.spec(), weights, &quant)?)
        }
        "olmoe" => {
            let c: olmoe::OlmoeConfig = parse(&config, &config_path)?;
            Box::new(dense::DenseDecoder::load(&c.spec(), weights, &quant)?)
        }
        "gemma3_text" => {
            let c: gemma3_text::Gemma3TextConfig = parse(&config, &config_path)?;
            Box::new(gemma3_text::Gemma3Text::load(c, weights, &quant)?)
        }
        "phi3" => {
            let c: phi3::Phi3Config = parse(&config, &config_path)?;
            Box::new(dense::DenseDecoder::load(&c.spec()?, weights, &quant)?)
        }
        other => {
            return Err(Error::model_file(
                &config_path,
                format!("model_type {other:?} is not supported; supported: {}", SUPPORTED.join(", ")),
            ))
        }
    };
    Ok((model, config))
}
