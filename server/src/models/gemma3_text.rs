//! Gemma 3 (text): sliding-window layers with a rotating cache and local rope,
//! a global layer every `sliding_window_pattern` layers, (1 + w) RMS norms
//! around both attention and MLP, gelu-gated MLP, embeddings scaled by √hidden.

use mlx_rs_safe::{ops, Array, Dtype};
use serde::Deserialize;

use super::attention::{Attention, AttentionSpec, QkNorm};
use super::config::{ConfigFile, RopeScaling};
use super::decoder::RopeSpec;
use super::layers::{Embedding, Linear, RmsNorm};
use super::mlp::{Activation, Mlp};
use super::placement::Placement;
use super::quant::QuantConfig;
use super::rope::Rope;
use super::weights::Weights;
use super::{KvLayout, LanguageModel};
use crate::error::Result;
use crate::kv::{KvKind, ModelCache};

#[derive(Debug, Deserialize)]
pub struct Gemma3TextConfig {
    #[serde(default = "d_hidden")]
    pub hidden_size: i32,
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i32,
    #[serde(default = "d_inter")]
    pub intermediate_size: i32,
    #[serde(default = "d_heads")]
    pub num_attention_heads: i32,
    #[serde(default = "d_head_dim")]
    pub head_dim: i32,
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "d_vocab")]
    pub vocab_size: i32,
    #[serde(default = "d_kv")]
    pub num_key_value_heads: i32,
    #[serde(default = "d_theta")]
    pub rope_theta: f32,
    #[serde(default = "d_local")]
    pub rope_local_base_freq: f32,
    #[serde(default = "d_qscalar")]
    pub query_pre_attn_scalar: f32,
    #[serde(default = "d_window")]
    pub sliding_window: i32,
    #[serde(default = "d_pattern")]
    pub sliding_window_pattern: i32,
}

// mlx-lm's defaults (Gemma 3 1B).
fn d_hidden() -> i32 { 1152 }
fn d_layers() -> i32 { 26 }
fn d_inter() -> i32 { 6912 }
fn d_heads() -> i32 { 4 }
fn d_head_dim() -> i32 { 256 }
fn d_eps() -> f32 { 1e-6 }
fn d_vocab() -> i32 { 262_144 }
fn d_kv() -> i32 { 1 }
fn d_theta() -> f32 { 1_000_000.0 }
fn d_local() -> f32 { 10_000.0 }
fn d_qscalar() -> f32 { 256.0 }
fn d_window() -> i32 { 512 }
fn d_pattern() -> i32 { 6 }

struct Block {
    attn: Attention,
    mlp: Mlp,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ffn_norm: RmsNorm,
    post_ffn_norm: RmsNorm,
}

pub struct Gemma3Text {
    cfg: Gemma3TextConfig,
    embed: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    placement: Placement,
    /// Ranks sharing each layer's heads (tensor parallelism), else 1.
    ranks: i32,
}

impl Gemma3TextConfig {
    /// What the model's KV cache holds: sliding layers keep a rotating window.
    pub fn kv_layout(&self) -> KvLayout {
        let kinds = (0..self.num_hidden_layers)
            .map(|i| if self.is_global(i) { KvKind::Dense } else { KvKind::Rotating { max_size: self.sliding_window } })
            .collect();
        KvLayout { kinds, kv_heads: self.num_key_value_heads, head_dim: self.head_dim, query_heads: self.num_attention_heads, attention_sinks: false, fixed_kv: None }
    }

    fn is_global(&self, layer: i32) -> bool {
        layer % self.sliding_window_pattern == self.sliding_window_pattern - 1
    }
}

/// x + y, computed in float32 and clipped to the float16 range when x is
/// float16 (mlx-lm's clip_residual).
fn clip_residual(x: &Array, y: &Array) -> Result<Array> {
    if x.dtype() != Dtype::Float16 {
        return Ok(ops::add(x, y)?);
    }
    let sum = ops::add(&ops::astype(x, Dtype::Float32)?, &ops::astype(y, Dtype::Float32)?)?;
    let bound = 65504.0f32;
    let clipped = ops::clip(&sum, Some(&Array::scalar(-bound)), Some(&Array::scalar(bound)))?;
    Ok(ops::astype(&clipped, Dtype::Float16)?)
}

impl Gemma3Text {
    /// Loads each layer on the device `placement` gives it.
    pub fn load(config: &ConfigFile, mut w: Weights, quant: &QuantConfig, placement: Placement) -> Result<Gemma3Text> {
        let cfg: Gemma3TextConfig = config.parse()?;
        if matches!(w.sharding(), super::weights::Sharding::Pipeline(g, _) if g.size() > 1) {
            return Err(crate::error::Error::Config(
                "pipeline parallelism does not run Gemma 3 yet (it runs the llama, qwen2, qwen3, mistral, phi3 and MoE families); use --distributed tensor".into(),
            ));
        }
        let ranks = w.tensor_parallel().map_or(1, |g| g.size() as i32);
        let rope_scaling = RopeScaling::read(config, "rope_scaling", (cfg.head_dim / 2) as usize, None)?;
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let norm = |w: &mut Weights, p: &str, dim: i32| RmsNorm::load_plus_one(w, p, dim, eps);
        let mut layers = Vec::new();
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let rope = Rope::new(&if cfg.is_global(i) {
                RopeSpec { theta: cfg.rope_theta, traditional: false, scaling: rope_scaling.clone(), dims: cfg.head_dim }
            } else {
                RopeSpec { theta: cfg.rope_local_base_freq, traditional: false, scaling: RopeScaling::Default, dims: cfg.head_dim }
            })?;
            let spec = AttentionSpec {
                n_heads: cfg.num_attention_heads,
                n_kv_heads: cfg.num_key_value_heads,
                head_dim: cfg.head_dim,
                qkv_bias: false,
                o_bias: false,
                qk_norm: QkNorm::PerHeadPlusOne(eps),
                scale: Some(cfg.query_pre_attn_scalar.powf(-0.5)),
                fused_qkv: false,
                sinks: false,
            };
            let block = placement.run(i as usize, || {
                Ok(Block {
                    attn: Attention::load(&mut w, &format!("{p}.self_attn"), h, spec, rope, quant)?,
                    mlp: Mlp::load_with(&mut w, &format!("{p}.mlp"), h, cfg.intermediate_size, false, Activation::GeluApprox, quant)?,
                    input_norm: norm(&mut w, &format!("{p}.input_layernorm"), h)?,
                    post_attn_norm: norm(&mut w, &format!("{p}.post_attention_layernorm"), h)?,
                    pre_ffn_norm: norm(&mut w, &format!("{p}.pre_feedforward_layernorm"), h)?,
                    post_ffn_norm: norm(&mut w, &format!("{p}.post_feedforward_layernorm"), h)?,
                })
            })?;
            layers.push(block);
        }
        // Tied unless the checkpoint carries an output head (mlx-lm's sanitize).
        let embed = Embedding::load(&mut w, "model.embed_tokens", cfg.vocab_size, h, quant)?;
        let (final_norm, lm_head) = placement.run_head(layers.len(), || {
            let head = if w.contains("lm_head.weight") || w.contains("lm_head.scales") {
                Some(Linear::load(&mut w, "lm_head", h, cfg.vocab_size, false, quant)?)
            } else {
                None
            };
            Ok((norm(&mut w, "model.norm", h)?, head))
        })?;
        let model = Gemma3Text { embed, norm: final_norm, lm_head, layers, cfg, placement, ranks };
        w.finish()?;
        Ok(model)
    }
}

impl LanguageModel for Gemma3Text {
    fn forward(&self, tokens: &Array, cache: &mut ModelCache) -> Result<Array> {
        let mut h = self.embed.forward(tokens)?;
        // sqrt(hidden) rounded to bfloat16, then cast to the activations' dtype.
        let scale = ops::astype(&ops::astype(&Array::scalar((self.cfg.hidden_size as f32).sqrt()), Dtype::Bfloat16)?, h.dtype())?;
        h = ops::multiply(&h, &scale)?;
        let (caches, masks) = cache.for_forward();
        for (i, (layer, cache)) in self.layers.iter().zip(caches.iter_mut()).enumerate() {
            let window = (!self.cfg.is_global(i as i32)).then_some(self.cfg.sliding_window);
            h = self.placement.run(i, || {
                let r = layer.attn.forward(&layer.input_norm.forward(&h)?, cache, masks, window)?;
                let hh = clip_residual(&h, &layer.post_attn_norm.forward(&r)?)?;
                let r = layer.mlp.forward(&layer.pre_ffn_norm.forward(&hh)?)?;
                clip_residual(&hh, &layer.post_ffn_norm.forward(&r)?)
            })?;
        }
        self.placement.run_head(self.layers.len(), || {
            self.embed.logits(self.lm_head.as_ref(), &self.norm.forward(&h)?)
        })
    }


    fn kv_layout(&self) -> KvLayout {
        // This rank's share of the KV heads.
        let full = self.cfg.kv_layout();
        KvLayout { kv_heads: full.kv_heads / self.ranks, query_heads: full.query_heads / self.ranks, ..full }
    }
}
