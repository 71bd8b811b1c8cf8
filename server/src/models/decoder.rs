//! The decoder-only transformer most architectures share: embedding → N ×
//! (norm → attention → residual → norm → feed-forward → residual) → norm →
//! output head (tied to the embedding or separate). The feed-forward of a layer
//! is a dense MLP or a sparse mixture of experts. Architectures differ only in
//! the [`DecoderSpec`] their config maps to.

use mlx_rs_safe::{ops, Array};

use super::attention::{Attention, AttentionSpec};
use super::config::RopeScaling;
use super::layers::{kv_heads_per_rank, Embedding, Linear, RmsNorm};
use super::mlp::Mlp;
use super::pipeline::PipelineStage;
use super::placement::Placement;
use super::moe::{MoeSpec, SparseMoe};
use super::quant::QuantConfig;
use super::rope::Rope;
use super::weights::Weights;
use super::{KvLayout, LanguageModel};
use crate::error::Result;
use crate::kv::{KvKind, ModelCache};

/// Rotary embeddings of a layer.
#[derive(Debug, Clone)]
pub struct RopeSpec {
    pub theta: f32,
    pub traditional: bool,
    pub scaling: RopeScaling,
    /// Rotated features per head (fewer than head_dim with partial rotary).
    pub dims: i32,
}

#[derive(Debug, Clone)]
pub struct DecoderSpec {
    pub vocab_size: i32,
    pub hidden_size: i32,
    pub num_layers: i32,
    pub intermediate_size: i32,
    pub attention: AttentionSpec,
    pub mlp_bias: bool,
    pub rms_norm_eps: f32,
    pub rope: RopeSpec,
    /// One fused gate_up projection in the MLP (Phi-3).
    pub fused_gate_up: bool,
    pub tie_word_embeddings: bool,
    /// Sparse MoE feed-forward on the layers flagged in `moe_layers`.
    pub moe: Option<MoeSpec>,
    /// Per layer: MoE (true) or dense MLP. Missing entries are dense.
    pub moe_layers: Vec<bool>,
    /// Per layer: the sliding window it attends within, None for full
    /// attention. Missing entries are full.
    pub windows: Vec<Option<i32>>,
    /// The family's renaming of checkpoint layouts other than mlx-lm's (its
    /// `sanitize`), run over the weights before any is taken.
    pub sanitize: Option<fn(&mut Weights, &DecoderSpec) -> Result<()>>,
}

impl DecoderSpec {
    fn window(&self, layer: usize) -> Option<i32> {
        self.windows.get(layer).copied().flatten()
    }

    /// What the cache of `layer` holds: a rotating window on sliding layers
    /// (mlx-lm's RotatingKVCache), every position elsewhere.
    fn kv_kind(&self, layer: usize) -> KvKind {
        match self.window(layer) {
            Some(max_size) => KvKind::Rotating { max_size },
            None => KvKind::Dense,
        }
    }

    /// What the model's KV cache holds.
    pub fn kv_layout(&self) -> KvLayout {
        KvLayout {
            kinds: (0..self.num_layers as usize).map(|i| self.kv_kind(i)).collect(),
            kv_heads: self.attention.n_kv_heads,
            head_dim: self.attention.head_dim,
            query_heads: self.attention.n_heads,
            attention_sinks: self.attention.sinks,
            fixed_kv: None,
        }
    }
}

/// A layer's feed-forward: one dense MLP or a mixture of experts.
pub(super) enum FeedForward {
    Dense(Mlp),
    // Boxed: a sparse block holds many more arrays than a dense one.
    Moe(Box<SparseMoe>),
}

impl FeedForward {
    pub(super) fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Moe(m) => m.forward(x),
        }
    }

    /// `h + forward(norm.forward(h))`: a dense MLP's products apply the norm
    /// and add the sum in their kernels where they apply.
    pub(super) fn forward_normed_add(&self, h: &Array, norm: &RmsNorm) -> Result<Array> {
        match self {
            FeedForward::Dense(m) => m.forward_normed_add(h, norm),
            FeedForward::Moe(m) => Ok(ops::add(h, &m.forward(&norm.forward(h)?)?)?),
        }
    }
}

struct Block {
    input_norm: RmsNorm,
    attn: Attention,
    post_attn_norm: RmsNorm,
    mlp: FeedForward,
}

pub struct Decoder {
    embed: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    placement: Placement,
    /// The layers this rank runs (all of them without pipeline parallelism).
    stage: PipelineStage,
    /// Per layer of this rank: its sliding window, if any.
    windows: Vec<Option<i32>>,
    layout: KvLayout,
}

impl Decoder {
    /// Loads each layer on the device `placement` gives it (its weights are
    /// read and checked there).
    pub fn load(spec: &DecoderSpec, mut w: Weights, quant: &QuantConfig, placement: Placement) -> Result<Decoder> {
        // Weights mlx-lm's sanitize drops: precomputed rotary tables, and the
        // output head when it is tied to the embedding.
        w.discard(|k| k.contains("self_attn.rotary_emb.inv_freq"));
        if spec.tie_word_embeddings {
            w.discard(|k| k.starts_with("lm_head."));
        }
        if let Some(sanitize) = spec.sanitize {
            sanitize(&mut w, spec)?;
        }
        let stage = PipelineStage::of(w.sharding(), spec.num_layers as usize)?.with_experts(w.streaming());
        w.discard(|k| stage.foreign(k));
        let eps = spec.rms_norm_eps;
        let (h, v) = (spec.hidden_size, spec.vocab_size);
        let mut layers = Vec::with_capacity(stage.layers.len());
        for i in stage.layers.clone().map(|i| i as i32) {
            let p = format!("model.layers.{i}");
            let block = placement.run(i as usize, || {
                Ok(Block {
                    input_norm: RmsNorm::load(&mut w, &format!("{p}.input_layernorm"), h, eps)?,
                    attn: Attention::load(&mut w, &format!("{p}.self_attn"), h, spec.attention.clone(), Rope::new(&spec.rope)?, quant)?,
                    post_attn_norm: RmsNorm::load(&mut w, &format!("{p}.post_attention_layernorm"), h, eps)?,
                    mlp: match &spec.moe {
                        Some(moe) if spec.moe_layers.get(i as usize).copied().unwrap_or(false) => {
                            FeedForward::Moe(Box::new(SparseMoe::load(&mut w, &format!("{p}.{}", moe.module), i as u32, h, moe.clone(), quant)?))
                        }
                        _ if spec.fused_gate_up => FeedForward::Dense(Mlp::load_fused(&mut w, &format!("{p}.mlp"), h, spec.intermediate_size, quant)?),
                        _ => FeedForward::Dense(Mlp::load(&mut w, &format!("{p}.mlp"), h, spec.intermediate_size, spec.mlp_bias, quant)?),
                    },
                })
            })?;
            layers.push(block);
        }
        let embed = Embedding::load(&mut w, "model.embed_tokens", v, h, quant)?;
        let (norm, lm_head) = placement.run_head(stage.layers.end, || {
            let norm = RmsNorm::load(&mut w, "model.norm", h, eps)?;
            let head = if spec.tie_word_embeddings { None } else { Some(Linear::load(&mut w, "lm_head", h, v, false, quant)?) };
            Ok((norm, head))
        })?;
        // This rank's caches: its layers', its share of the KV heads.
        let ranks = w.tensor_parallel().map_or(1, |g| g.size() as i32);
        let kv_heads = kv_heads_per_rank(spec.attention.n_kv_heads, ranks).unwrap_or(spec.attention.n_kv_heads);
        let layout = KvLayout {
            kinds: stage.layers.clone().map(|i| spec.kv_kind(i)).collect(),
            kv_heads,
            head_dim: spec.attention.head_dim,
            query_heads: (spec.attention.n_heads / ranks).max(1),
            attention_sinks: spec.attention.sinks,
            fixed_kv: None,
        };
        let windows = stage.layers.clone().map(|i| spec.window(i)).collect();
        let model = Decoder { embed, norm, lm_head, layers, placement, stage, windows, layout };
        w.finish()?;
        Ok(model)
    }
}

impl LanguageModel for Decoder {
    fn forward(&self, tokens: &Array, cache: &mut ModelCache) -> Result<Array> {
        let start = self.stage.layers.start;
        let h = self.stage.forward(self.embed.forward(tokens)?, cache, |i, h, cache, masks| {
            let (layer, window) = (&self.layers[i - start], self.windows[i - start]);
            self.placement.run(i, || {
                // h + attention(norm(h)), then hh + MLP(norm(hh)): where the
                // decode kernel applies, each norm is taken by the product
                // after it and each sum written by the product before it
                // (with the MLP's gate/up/swiglu, five kernels fewer a layer).
                let hh = layer.attn.forward_normed_add(&h, &layer.input_norm, cache, masks, window)?;
                layer.mlp.forward_normed_add(&hh, &layer.post_attn_norm)
            })
        })?;
        self.placement.run_head(self.stage.layers.end, || {
            self.embed.logits(self.lm_head.as_ref(), &self.norm.forward(&h)?)
        })
    }


    fn kv_layout(&self) -> KvLayout {
        self.layout.clone()
    }
}
