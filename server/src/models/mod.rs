//! Model architectures over shared building blocks, and the registry from
//! config.json's `model_type` to a loaded model.

mod attention;
pub(crate) mod compiled;
mod config;
mod decoder;
mod gemma3_text;
mod gated_delta;
mod gemma4_text;
mod gpt_oss;
mod layers;
mod llama;
mod mixtral;
mod mlp;
mod moe;
mod phi3;
mod olmoe;
mod pipeline;
mod placement;
pub mod prompt_matmul;
pub mod quant;
pub mod quant_kernel;
mod qwen2;
mod qwen2_moe;
mod qwen3;
mod qwen3_moe;
mod qwen3_next;
mod router_kernel;
mod rope;
mod speculative_step;
mod streamed_switch;
mod switch;
pub mod weights;

use std::path::{Path, PathBuf};

use mlx_rs_safe::Array;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::kv::{KvKind, ModelCache, AFFINE_BITS, AFFINE_GROUP_SIZES};
pub use config::ConfigFile;
pub use placement::Placement;
use decoder::{Decoder, DecoderSpec};
use quant::QuantConfig;
use weights::Weights;
pub use weights::Sharding;
pub use pipeline::{point_to_point_works, Transfer};

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
    /// Query heads of an attention layer: with a prefill chunk's length and
    /// the context they size attention's scores where no fused kernel runs.
    pub query_heads: i32,
    /// Attention with learned sinks (gpt-oss), which TurboQuant's kernels lack.
    pub attention_sinks: bool,
    /// Why no KV compression applies to this model, if none does.
    pub fixed_kv: Option<&'static str>,
}

impl KvLayout {
    /// Whether a cache of any length can be cut back to any shorter prefix:
    /// not with a sliding window that moved on, nor a recurrent state. Such
    /// models keep prompt-cache checkpoints (a chat's system prompt, each
    /// prompt's end) as their prefill passes them.
    pub fn restores_any_prefix(&self) -> bool {
        self.kinds.iter().all(|k| !matches!(k, KvKind::Rotating { .. } | KvKind::Recurrent { .. }))
    }
}

/// How an architecture is built from its config: the shared decoder from the
/// spec its config maps to, or a model of its own.
#[derive(Clone, Copy)]
enum Arch {
    Decoder(fn(&ConfigFile) -> Result<DecoderSpec>),
    Gemma3Text,
    Gemma4Text,
    /// Gemma 4's multimodal checkpoints, through their text tower.
    Gemma4,
    /// Qwen3-Next: Gated DeltaNet layers beside gated full attention.
    Qwen3Next,
    /// Qwen3.5 (dense and MoE) checkpoints, through their text model.
    Qwen35,
}

impl Arch {
    /// What the model's KV cache will hold, from its config alone.
    fn kv_layout(self, c: &ConfigFile) -> Result<KvLayout> {
        match self {
            Arch::Decoder(spec) => Ok(spec(c)?.kv_layout()),
            Arch::Gemma3Text => Ok(c.parse::<gemma3_text::Gemma3TextConfig>()?.kv_layout()),
            Arch::Gemma4Text => c.parse::<gemma4_text::Gemma4TextConfig>()?.kv_layout(),
            Arch::Gemma4 => {
                let text = gemma4_text::text_config(c)?;
                ConfigFile { value: &text, path: c.path }.parse::<gemma4_text::Gemma4TextConfig>()?.kv_layout()
            }
            Arch::Qwen3Next => c.parse::<qwen3_next::Qwen3NextConfig>()?.kv_layout(),
            Arch::Qwen35 => {
                let text = qwen3_next::text_config(c)?;
                ConfigFile { value: &text, path: c.path }.parse::<qwen3_next::Qwen3NextConfig>()?.kv_layout()
            }
        }
    }

    fn load(self, c: &ConfigFile, w: Weights, quant: &QuantConfig, placement: Placement) -> Result<Box<dyn LanguageModel>> {
        Ok(match self {
            Arch::Decoder(spec) => Box::new(Decoder::load(&spec(c)?, w, quant, placement)?),
            Arch::Gemma3Text => Box::new(gemma3_text::Gemma3Text::load(c, w, quant, placement)?),
            Arch::Gemma4Text => Box::new(gemma4_text::Gemma4Text::load(c, w, quant, placement)?),
            Arch::Gemma4 => {
                let text = gemma4_text::text_config(c)?;
                let mut w = w;
                w.rename(gemma4_text::text_tensor_name);
                let quant = quant.clone().rename(gemma4_text::text_tensor_name);
                Box::new(gemma4_text::Gemma4Text::load(&ConfigFile { value: &text, path: c.path }, w, &quant, placement)?)
            }
            Arch::Qwen3Next => Box::new(qwen3_next::Qwen3Next::load(c, qwen3_next::Family::Next, w, quant, placement)?),
            Arch::Qwen35 => {
                let text = qwen3_next::text_config(c)?;
                let mut w = w;
                w.rename(qwen3_next::text_tensor_name);
                let quant = quant.clone().rename(qwen3_next::text_tensor_name);
                let text = ConfigFile { value: &text, path: c.path };
                Box::new(qwen3_next::Qwen3Next::load(&text, qwen3_next::Family::Qwen35, w, &quant, placement)?)
            }
        })
    }
}

/// `model_type` → architecture (mistral is llama, as in mlx-lm).
const REGISTRY: &[(&str, Arch)] = &[
    ("llama", Arch::Decoder(llama::spec)),
    ("mistral", Arch::Decoder(llama::spec)),
    ("qwen2", Arch::Decoder(qwen2::spec)),
    ("qwen3", Arch::Decoder(qwen3::spec)),
    ("qwen3_moe", Arch::Decoder(qwen3_moe::spec)),
    ("qwen2_moe", Arch::Decoder(qwen2_moe::spec)),
    ("mixtral", Arch::Decoder(mixtral::spec)),
    ("olmoe", Arch::Decoder(olmoe::spec)),
    ("phi3", Arch::Decoder(phi3::spec)),
    ("gemma3_text", Arch::Gemma3Text),
    ("gemma4_text", Arch::Gemma4Text),
    ("gemma4", Arch::Gemma4),
    ("gpt_oss", Arch::Decoder(gpt_oss::spec)),
    ("qwen3_next", Arch::Qwen3Next),
    ("qwen3_5", Arch::Qwen35),
    ("qwen3_5_moe", Arch::Qwen35),
];

/// `model_type`s this build can load.
pub fn supported() -> Vec<&'static str> {
    REGISTRY.iter().map(|(name, _)| *name).collect()
}

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Quantize an unquantized model at load (`--quantize`), as mlx_lm.convert would.
    pub quantize: Option<quant::QuantSpec>,
    /// Stream the routed experts of a MoE model from disk (`--stream-experts`).
    pub experts: Option<crate::experts::ExpertOptions>,
    /// Which device runs each layer (`--gpu-layers`).
    pub placement: Placement,
    /// How the model is split over a distributed group (`--distributed`).
    pub sharding: Sharding,
}

/// A loaded model and its config.json (or the config its GGUF file maps to).
pub struct LoadedModel {
    pub model: Box<dyn LanguageModel>,
    pub config: Value,
}

/// Loads the model in folder `dir` (config.json + safetensors), or the GGUF
/// file `dir` stands for (see [`crate::gguf::locate`]).
pub fn load(dir: &Path) -> Result<LoadedModel> {
    load_with(dir, &LoadOptions::default())
}

/// [`load`] with options.
pub fn load_with(dir: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    ModelFiles::open(dir, opts.quantize)?.load(opts)
}

/// config.json of the model folder `dir`, and its path.
fn folder_config(dir: &Path) -> Result<(Value, PathBuf)> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| Error::model_file(&config_path, format!("cannot read: {e}")))?;
    let config = serde_json::from_str(&text).map_err(|e| Error::model_file(&config_path, format!("invalid JSON: {e}")))?;
    Ok((config, config_path))
}

/// What the memory plan needs to know of a model before it loads.
#[derive(Debug, Clone)]
pub struct ModelShape {
    pub weights: weights::WeightFootprint,
    pub kv_layout: KvLayout,
}

impl ModelShape {
    /// What one rank of a distributed group holds of the model: under tensor
    /// parallelism a 1/N share of each layer's weights and KV heads (the
    /// embedding, norms and head stay whole), under pipeline parallelism its
    /// run of whole layers.
    pub fn share(&self, sharding: &Sharding) -> Result<ModelShape> {
        let mut shape = self.clone();
        match sharding {
            Sharding::Whole => {}
            Sharding::Tensor(g) => {
                let n = g.size() as u64;
                shape.weights.layers.iter_mut().chain(shape.weights.routed.iter_mut()).for_each(|b| *b = b.div_ceil(n));
                shape.kv_layout.kv_heads = (shape.kv_layout.kv_heads / g.size() as i32).max(1);
                shape.kv_layout.query_heads = (shape.kv_layout.query_heads / g.size() as i32).max(1);
            }
            Sharding::Pipeline(..) => {
                let stage = pipeline::PipelineStage::of(sharding, shape.kv_layout.kinds.len())?;
                let keep = |v: &mut Vec<u64>| *v = v.get(stage.layers.clone()).map(<[u64]>::to_vec).unwrap_or_default();
                keep(&mut shape.weights.layers);
                keep(&mut shape.weights.routed);
                shape.kv_layout.kinds = shape.kv_layout.kinds[stage.layers.clone()].to_vec();
            }
        }
        Ok(shape)
    }
}

/// A model's files opened: its config read and its tensors indexed (a
/// safetensors tensor is read when first evaluated, so nothing is read yet
/// but headers); what the memory plan looks at before the model loads.
pub struct ModelFiles {
    config: Value,
    config_path: PathBuf,
    weights: Weights,
    quant: QuantConfig,
    arch: Arch,
    gguf: bool,
    /// Quantized at load (`--quantize`).
    quantized_at_load: bool,
}

impl ModelFiles {
    /// Opens folder (or GGUF file) `dir`; `quantize`: `--quantize`.
    pub fn open(dir: &Path, quantize: Option<quant::QuantSpec>) -> Result<ModelFiles> {
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
        let arch = REGISTRY.iter().find(|(name, _)| *name == model_type).map(|(_, arch)| *arch).ok_or_else(|| {
            Error::model_file(&config_path, format!("model_type {model_type:?} is not supported; supported: {}", supported().join(", ")))
        })?;
        let mut quant = QuantConfig::from_config(&config)?;
        if let Some(q) = quantize {
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
        Ok(ModelFiles { config, config_path, weights, quant, arch, gguf: gguf.is_some(), quantized_at_load: quantize.is_some() })
    }

    /// The config (config.json, or what the GGUF file maps to).
    pub fn config(&self) -> ConfigFile<'_> {
        ConfigFile { value: &self.config, path: &self.config_path }
    }

    /// The weights' bytes and the KV layout, before anything is read.
    pub fn shape(&self) -> Result<ModelShape> {
        Ok(ModelShape { weights: self.weights.footprint(), kv_layout: self.arch.kv_layout(&self.config())? })
    }

    /// Builds the model, reading (and checking) its weights.
    pub fn load(mut self, opts: &LoadOptions) -> Result<LoadedModel> {
        if let Some(experts) = &opts.experts {
            if self.gguf {
                return Err(Error::Config(format!(
                    "--stream-experts reads the experts' bytes where they lie in safetensors files; {} is a GGUF file, whose blocks are repacked at load",
                    self.config_path.display()
                )));
            }
            if self.quantized_at_load {
                return Err(Error::Config("--stream-experts reads experts as stored: it cannot be combined with --quantize".into()));
            }
            let (expert_bytes, resident_bytes) = self.weights.stored_bytes();
            let stream = crate::experts::ExpertStream::start(experts, &self.weights.files(), expert_bytes, resident_bytes)?;
            self.weights.stream_experts(std::sync::Arc::new(stream));
        }
        if !matches!(opts.sharding, Sharding::Whole) && self.quantized_at_load {
            return Err(Error::Config("--distributed splits the weights as stored: it cannot be combined with --quantize".into()));
        }
        self.weights.shard(opts.sharding.clone());
        let config = ConfigFile { value: &self.config, path: &self.config_path };
        let model = self.arch.load(&config, self.weights, &self.quant, opts.placement)?;
        if self.quant.has_affine_layers() {
            // On CUDA the quantized-matmul kernel's start-up check compiles it
            // (NVRTC, in every process: 6.9 s on an H200): here, not inside
            // the first request. Elsewhere this returns at once.
            quant_kernel::in_use();
        }
        // The weight checks' temporaries: not kept for reuse.
        mlx_rs_safe::memory::clear_cache()?;
        Ok(LoadedModel { model, config: self.config })
    }
}
