//! Model architectures over shared building blocks, and the registry from
//! config.json's `model_type` to a loaded model.

mod attention;
pub(crate) mod compiled;
mod config;
mod decoder;
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
mod streamed_switch;
mod switch;
pub mod weights;

use std::path::{Path, PathBuf};

use mlx_rs_safe::Array;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::kv::{KvKind, ModelCache, AFFINE_BITS, AFFINE_GROUP_SIZES};
pub use config::ConfigFile;
use decoder::{Decoder, DecoderSpec};
use quant::QuantConfig;
use weights::Weights;

/// A causal language model: token ids in, logits out, state in a KV cache.
pub trait LanguageModel: Send {
    /// `tokens`: [B, L] int32 → logits [B, L, vocab], for the B sequences of
    /// `cache`, whose keys and values it appends.
    fn forward(&self, tokens: &Array, cache: &mut ModelCache) -> Result<Array>;
    /// What its KV cache holds per layer.
    fn kv_layout(&self) -> KvLayout;
}

/// A model's KV cache layout: each layer's cache kind (dense, or a rotating
/// window), and the KV heads and head size of its attention.
#[derive(Debug, Clone)]
pub struct KvLayout {
    pub kinds: Vec<KvKind>,
    pub kv_heads: i32,
    pub head_dim: i32,
}

/// How each `model_type` loads: the shared decoder from its config's spec, or
/// an architecture of its own.
type Loader = fn(&ConfigFile, Weights, &QuantConfig) -> Result<Box<dyn LanguageModel>>;

fn decoder(spec: DecoderSpec, w: Weights, quant: &QuantConfig) -> Result<Box<dyn LanguageModel>> {
    Ok(Box::new(Decoder::load(&spec, w, quant)?))
}

/// `model_type` → loader (mistral is llama, as in mlx-lm).
const REGISTRY: &[(&str, Loader)] = &[
    ("llama", |c, w, q| decoder(llama::spec(c)?, w, q)),
    ("mistral", |c, w, q| decoder(llama::spec(c)?, w, q)),
    ("qwen2", |c, w, q| decoder(qwen2::spec(c)?, w, q)),
    ("qwen3", |c, w, q| decoder(qwen3::spec(c)?, w, q)),
    ("qwen3_moe", |c, w, q| decoder(qwen3_moe::spec(c)?, w, q)),
    ("qwen2_moe", |c, w, q| decoder(qwen2_moe::spec(c)?, w, q)),
    ("mixtral", |c, w, q| decoder(mixtral::spec(c)?, w, q)),
    ("olmoe", |c, w, q| decoder(olmoe::spec(c)?, w, q)),
    ("phi3", |c, w, q| decoder(phi3::spec(c)?, w, q)),
    ("gemma3_text", |c, w, q| Ok(Box::new(gemma3_text::Gemma3Text::load(c, w, q)?))),
];

/// `model_type`s this build can load.
pub fn supported() -> Vec<&'static str> {
    REGISTRY.iter().map(|(name, _)| *name).collect()
}

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Quantize an unquantized model at load (`--quantize`), as mlx_lm.convert would.
    pub quantize: Option<quant::QuantParams>,
    /// Stream the routed experts of a MoE model from disk (`--stream-experts`).
    pub experts: Option<crate::experts::ExpertOptions>,
}

/// Loads the model in folder `dir` (config.json + safetensors), or the GGUF
/// file `dir` stands for (see [`crate::gguf::locate`]).
pub fn load(dir: &Path) -> Result<(Box<dyn LanguageModel>, Value)> {
    load_with(dir, &LoadOptions::default())
}

/// config.json of the model folder `dir`, and its path.
fn folder_config(dir: &Path) -> Result<(Value, PathBuf)> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| Error::model_file(&config_path, format!("cannot read: {e}")))?;
    let config = serde_json::from_str(&text).map_err(|e| Error::model_file(&config_path, format!("invalid JSON: {e}")))?;
    Ok((config, config_path))
}

/// [`load`] with options.
pub fn load_with(dir: &Path, opts: &LoadOptions) -> Result<(Box<dyn LanguageModel>, Value)> {
    let gguf = crate::gguf::locate(dir)?;
    let (config, config_path, mut weights) = match &gguf {
        Some(file) => {
            let model = crate::gguf::GgufModel::open(file)?;
            (model.config()?, file.clone(), model.weights()?)
        }
        None => {
            let (config, path) = folder_config(dir)?;
            (config, path, Weights::load(dir)?)
        }
    };
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::model_file(&config_path, "missing field `model_type`"))?;
    let mut quant = QuantConfig::from_config(&config)?;
    if let Some(experts) = &opts.experts {
        if gguf.is_some() {
            return Err(Error::Config(format!(
                "--stream-experts reads the experts' bytes where they lie in safetensors files; {} is a GGUF file, whose blocks are repacked at load",
                config_path.display()
            )));
        }
        if opts.quantize.is_some() {
            return Err(Error::Config("--stream-experts reads experts as stored: it cannot be combined with --quantize".into()));
        }
        let (expert_bytes, resident_bytes) = weights.stored_bytes();
        let stream = crate::experts::ExpertStream::start(experts, &weights.files(), expert_bytes, resident_bytes)?;
        weights.stream_experts(std::sync::Arc::new(stream));
    }
    if let Some(q) = opts.quantize {
        // A GGUF file may mix blocks MLX keeps (Q4_0, Q4_1, Q8_0: named per
        // layer in its config) with ones dequantized at load: those are quantized.
        if quant.is_quantized() && gguf.is_none() {
            return Err(Error::Config(format!(
                "{} is already quantized; --quantize applies to float models",
                dir.display()
            )));
        }
        if !AFFINE_BITS.contains(&q.bits) || !AFFINE_GROUP_SIZES.contains(&q.group_size) {
            return Err(Error::Config(format!(
                "--quantize needs bits in 2, 3, 4, 5, 6, 8 and a group size of 32, 64 or 128 (got {} bits, group {})",
                q.bits, q.group_size
            )));
        }
        if weights.quantize_in_place(q.group_size, q.bits)? == 0 {
            return Err(Error::Config(format!("--quantize: {} has no float weight matrix to quantize", dir.display())));
        }
        quant = quant.with_default(q);
    }
    let load = REGISTRY.iter().find(|(name, _)| *name == model_type).map(|(_, load)| load).ok_or_else(|| {
        Error::model_file(&config_path, format!("model_type {model_type:?} is not supported; supported: {}", supported().join(", ")))
    })?;
    let model = load(&ConfigFile { value: &config, path: &config_path }, weights, &quant)?;
    // The weight checks' temporaries: not kept for reuse.
    mlx_rs_safe::memory::clear_cache()?;
    Ok((model, config))
}
