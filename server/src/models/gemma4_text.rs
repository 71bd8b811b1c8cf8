//! Gemma 4 (text): sliding-window and full-attention layers with head sizes of
//! their own (full layers: `global_head_dim`, "proportional" partial rope),
//! q/k RMS norms and an unscaled v norm, attention scale 1, the last
//! `num_kv_shared_layers` layers attending to the keys and values of the last
//! earlier layer of their type (no cache of their own), per-layer input
//! embeddings gating each layer's output, a learned scalar per layer, the
//! gelu-gated MLP (double-wide on KV-shared layers), an optional MoE block
//! beside the MLP (26B-A4B), and soft-capped logits — mlx-lm's gemma4_text, op
//! for op.

use std::collections::HashMap;

use mlx_rs_safe::{fast, ops, Array};
use serde::Deserialize;
use serde_json::Value;

use super::config::{ConfigFile, RopeScaling};
use super::decoder::RopeSpec;
use super::layers::{kv_heads_per_rank, Embedding, Linear, RmsNorm};
use super::mlp::{gelu_approx_compiled, Activation, Mlp};
use super::pipeline::PipelineStage;
use super::placement::Placement;
use super::quant::QuantConfig;
use super::rope::Rope;
use super::moe::{split_fused_experts, Experts, MoeParts, MoeSpec, Router, HF_GLU_NAMES};
use super::streamed_switch::Guesser;
use super::switch::GluActivation;
use super::weights::{Split, Weights};
use super::{KvLayout, LanguageModel};
use crate::error::{Error, Result};
use crate::kv::{AttendArgs, KvKind, LayerCache, ModelCache, StepMemo};

/// config.json's fields, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Gemma4TextConfig {
    #[serde(default = "d_hidden")]
    hidden_size: i32,
    #[serde(default = "d_layers")]
    num_hidden_layers: i32,
    #[serde(default = "d_inter")]
    intermediate_size: i32,
    #[serde(default = "d_heads")]
    num_attention_heads: i32,
    #[serde(default = "d_head_dim")]
    head_dim: i32,
    #[serde(default = "d_global_head_dim")]
    global_head_dim: i32,
    #[serde(default = "d_eps")]
    rms_norm_eps: f32,
    #[serde(default = "d_vocab")]
    vocab_size: i32,
    #[serde(default = "d_vocab")]
    vocab_size_per_layer_input: i32,
    #[serde(default = "d_one")]
    num_key_value_heads: i32,
    num_global_key_value_heads: Option<i32>,
    #[serde(default = "d_shared")]
    num_kv_shared_layers: i32,
    #[serde(default = "d_per_layer")]
    hidden_size_per_layer_input: i32,
    #[serde(default)]
    rope_traditional: bool,
    rope_parameters: Option<HashMap<String, Value>>,
    #[serde(default = "d_window")]
    sliding_window: i32,
    #[serde(default = "d_pattern")]
    sliding_window_pattern: i32,
    #[serde(default)]
    attention_k_eq_v: bool,
    #[serde(default = "d_softcap")]
    final_logit_softcapping: Option<f32>,
    #[serde(default = "d_true")]
    use_double_wide_mlp: bool,
    #[serde(default)]
    enable_moe_block: bool,
    num_experts: Option<i32>,
    top_k_experts: Option<i32>,
    moe_intermediate_size: Option<i32>,
    layer_types: Option<Vec<String>>,
    #[serde(default = "d_true")]
    tie_word_embeddings: bool,
}

fn d_hidden() -> i32 { 1536 }
fn d_layers() -> i32 { 35 }
fn d_inter() -> i32 { 6144 }
fn d_heads() -> i32 { 8 }
fn d_head_dim() -> i32 { 256 }
fn d_global_head_dim() -> i32 { 512 }
fn d_eps() -> f32 { 1e-6 }
fn d_vocab() -> i32 { 262_144 }
fn d_one() -> i32 { 1 }
fn d_shared() -> i32 { 20 }
fn d_per_layer() -> i32 { 256 }
fn d_window() -> i32 { 512 }
fn d_pattern() -> i32 { 5 }
fn d_softcap() -> Option<f32> { Some(30.0) }
fn d_true() -> bool { true }

impl Gemma4TextConfig {
    /// Each layer's type: `layer_types`, else sliding layers with a full one
    /// every `sliding_window_pattern`.
    fn types(&self) -> Result<Vec<bool>> {
        let n = self.num_hidden_layers as usize;
        let types: Vec<String> = match &self.layer_types {
            Some(t) => t.clone(),
            None => (0..n)
                .map(|i| if (i as i32 + 1) % self.sliding_window_pattern.max(1) == 0 { "full_attention" } else { "sliding_attention" }.to_string())
                .collect(),
        };
        if types.len() != n {
            return Err(Error::Config(format!("gemma4: layer_types has {} entries for {n} layers", types.len())));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" => Ok(true),
                "sliding_attention" => Ok(false),
                other => Err(Error::Config(format!("gemma4: layer type {other:?} is neither sliding_attention nor full_attention"))),
            })
            .collect()
    }

    /// The first layer without keys and values of its own.
    fn first_shared(&self) -> usize {
        (self.num_hidden_layers - self.num_kv_shared_layers).max(0) as usize
    }

    /// For each layer, the layer whose cache it attends to: its own, or for a
    /// KV-shared layer the last earlier layer of its type.
    fn kv_sources(&self, full: &[bool]) -> Result<Vec<usize>> {
        let first = self.first_shared();
        (0..full.len())
            .map(|i| match i < first {
                true => Ok(i),
                false => (0..first).rev().find(|&j| full[j] == full[i]).ok_or_else(|| {
                    Error::Config(format!("gemma4: KV-shared layer {i} has no earlier layer of its type to share"))
                }),
            })
            .collect()
    }

    /// What the model's KV cache holds: the layers with keys and values of
    /// their own; sliding ones keep a rotating window.
    pub fn kv_layout(&self) -> Result<KvLayout> {
        let full = self.types()?;
        let kinds = full[..self.first_shared()]
            .iter()
            .map(|&f| if f { KvKind::Dense } else { KvKind::Rotating { max_size: self.sliding_window } })
            .collect();
        Ok(KvLayout {
            kinds,
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            query_heads: self.num_attention_heads,
            attention_sinks: false,
            fixed_kv: self.fixed_kv_reason(),
        })
    }

    /// (experts, top-k, expert hidden size) of the MoE block, if the model has one.
    fn moe_shape(&self) -> Result<Option<(i32, i32, i32)>> {
        if !self.enable_moe_block {
            return Ok(None);
        }
        let missing = |f: &str| Error::Config(format!("gemma4: enable_moe_block needs {f}"));
        let e = self.num_experts.ok_or_else(|| missing("num_experts"))?;
        let k = self.top_k_experts.ok_or_else(|| missing("top_k_experts"))?;
        let inter = self.moe_intermediate_size.ok_or_else(|| missing("moe_intermediate_size"))?;
        if k < 1 || k > e {
            return Err(Error::Config(format!("gemma4: top_k_experts ({k}) must be between 1 and num_experts ({e})")));
        }
        Ok(Some((e, k, inter)))
    }

    /// Why no KV compression applies, if none does.
    fn fixed_kv_reason(&self) -> Option<&'static str> {
        if self.num_kv_shared_layers > 0 {
            Some("this model's last layers attend to earlier layers' keys and values (Gemma 4's KV sharing), which only the 16-bit cache keeps")
        } else if self.global_head_dim != self.head_dim {
            Some("this model's layers have head sizes of two kinds (Gemma 4's global layers)")
        } else {
            None
        }
    }

    /// The rope of a layer type, as mlx-lm's `rope_parameters` give it (errors
    /// name `path`, the config's file).
    fn rope(&self, full: bool, head_dim: i32, path: &std::path::Path) -> Result<Rope> {
        let key = if full { "full_attention" } else { "sliding_attention" };
        let default = if full {
            serde_json::json!({"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"})
        } else {
            serde_json::json!({"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"})
        };
        let params = match &self.rope_parameters {
            Some(p) => p.get(key).cloned().unwrap_or(Value::Object(Default::default())),
            None => default,
        };
        let theta = params.get("rope_theta").and_then(Value::as_f64).unwrap_or(10000.0) as f32;
        let holder = serde_json::json!({ "rope": params });
        let file = ConfigFile { value: &holder, path };
        let scaling = RopeScaling::read(&file, "rope", (head_dim / 2) as usize, None)?;
        Rope::new(&RopeSpec { theta, traditional: self.rope_traditional, scaling, dims: head_dim })
    }
}

/// Keys and values of a layer, or none (KV-shared layers).
struct KvProjections {
    k: Linear,
    /// None: values are the keys (`attention_k_eq_v` on full layers).
    v: Option<Linear>,
    k_norm: RmsNorm,
}

struct Attention {
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    q: Linear,
    o: Linear,
    q_norm: RmsNorm,
    kv: Option<KvProjections>,
    rope: Rope,
    eps: f32,
}

/// The MoE block beside the MLP (26B-A4B).
struct Moe {
    router_proj: Linear,
    /// rms_norm weight of the router's input: its `scale` × hidden^-0.5.
    router_norm: Array,
    per_expert_scale: Array,
    top_k: i32,
    eps: f32,
    /// In memory, or streamed from disk (`--stream-experts`).
    experts: Experts,
    pre_norm: RmsNorm,
    post_norm_1: RmsNorm,
    post_norm_2: RmsNorm,
    /// Under tensor parallelism: the experts' mixed output is this rank's
    /// partial sum, summed over the group (the router stays whole).
    reduce: Option<mlx_rs_safe::distributed::Group>,
}

/// The per-layer input's gate.
struct PerLayerGate {
    gate: Linear,
    projection: Linear,
    norm: RmsNorm,
}

struct Block {
    attn: Attention,
    mlp: Mlp,
    moe: Option<Moe>,
    per_layer: Option<PerLayerGate>,
    input_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    pre_ffn_norm: RmsNorm,
    post_ffn_norm: RmsNorm,
    layer_scalar: Array,
    full: bool,
}

/// The per-layer input embeddings and their projection from the hidden state.
struct PerLayerInputs {
    embed: Embedding,
    projection: Linear,
    norm: RmsNorm,
}

pub struct Gemma4Text {
    cfg: Gemma4TextConfig,
    embed: Embedding,
    per_layer: Option<PerLayerInputs>,
    layers: Vec<Block>,
    kv_sources: Vec<usize>,
    /// Per layer: a later layer shares its keys and values.
    shared: Vec<bool>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    placement: Placement,
    /// This rank's layers (all of them without pipeline parallelism).
    stage: PipelineStage,
    layout: KvLayout,
}

/// `x * v`, v a Python float next to an array: a scalar of x's dtype.
fn times(x: &Array, v: f64) -> Result<Array> {
    Ok(ops::multiply(x, &ops::scalar_as(v as f32, x.dtype())?)?)
}

impl Gemma4Text {
    pub fn load(config: &ConfigFile, mut w: Weights, quant: &QuantConfig, placement: Placement) -> Result<Gemma4Text> {
        let cfg: Gemma4TextConfig = config.parse()?;
        let full = cfg.types()?;
        // Under tensor parallelism each rank runs a run of every layer's heads.
        let ranks = w.tensor_parallel().map_or(1, |g| g.size() as i32);
        let kv_heads = |is_full: bool| match (cfg.attention_k_eq_v && is_full, cfg.num_global_key_value_heads) {
            (true, Some(n)) => n,
            _ => cfg.num_key_value_heads,
        };
        let heads = [cfg.num_attention_heads, kv_heads(false), kv_heads(true)];
        // KV heads fewer than the ranks are repeated on the ranks that share them.
        if heads[0] % ranks != 0 || heads[1..].iter().any(|&n| kv_heads_per_rank(n, ranks).is_none()) {
            return Err(Error::Config(format!(
                "tensor parallelism over {ranks} ranks: Gemma 4's {} query heads, {} KV heads on sliding layers and {} on full layers do not all divide among the ranks (KV heads may also divide the ranks); use --distributed pipeline",
                heads[0], heads[1], heads[2]
            )));
        }
        let kv_sources = cfg.kv_sources(&full)?;
        let first_shared = cfg.first_shared();
        let stage = PipelineStage::of(w.sharding(), full.len())?.with_experts(w.streaming());
        // A KV-shared layer reads its source layer's cache: both on one rank.
        // Every rank checks every stage, so all refuse alike.
        for layers in PipelineStage::all_of(w.sharding(), full.len()) {
            if let Some(i) = layers.clone().find(|&i| !layers.contains(&kv_sources[i])) {
                return Err(Error::Config(format!(
                    "pipeline parallelism: layer {i} attends to the keys and values of layer {}, which another rank would run (Gemma 4's KV sharing); use fewer ranks",
                    kv_sources[i]
                )));
            }
        }
        let moe = cfg.moe_shape()?;
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        // As mlx-lm's sanitize: rotary tables and the KV-shared layers' unused projections go.
        w.discard(|k| {
            k.contains("self_attn.rotary_emb")
                || ["input_max", "input_min", "output_max", "output_min"].iter().any(|s| k.contains(s))
                || layer_of(k).is_some_and(|l| l >= first_shared && [".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm"].iter().any(|s| k.contains(s)))
        });
        w.discard(|k| stage.foreign(k));
        let d_pl = cfg.hidden_size_per_layer_input;
        let mut layers = Vec::with_capacity(stage.layers.len());
        for i in stage.layers.clone() {
            let is_full = full[i];
            let p = format!("model.layers.{i}");
            let hd = if is_full && cfg.global_head_dim > 0 { cfg.global_head_dim } else { cfg.head_dim };
            let k_eq_v = cfg.attention_k_eq_v && is_full;
            let (n_heads, n_kv) = (cfg.num_attention_heads, kv_heads(is_full));
            let double = cfg.use_double_wide_mlp && i >= first_shared && first_shared > 0;
            let inter = cfg.intermediate_size * if double { 2 } else { 1 };
            let block = placement.run(i, || {
                let kv = match i < first_shared {
                    true => Some(KvProjections {
                        k: Linear::load_kv_heads(&mut w, &format!("{p}.self_attn.k_proj"), h, n_kv, hd, false, quant)?,
                        v: if k_eq_v { None } else { Some(Linear::load_kv_heads(&mut w, &format!("{p}.self_attn.v_proj"), h, n_kv, hd, false, quant)?) },
                        k_norm: RmsNorm::load(&mut w, &format!("{p}.self_attn.k_norm"), hd, eps)?,
                    }),
                    false => None,
                };
                let attn = Attention {
                    n_heads: n_heads / ranks,
                    n_kv_heads: kv_heads_per_rank(n_kv, ranks).unwrap_or(n_kv),
                    head_dim: hd,
                    q: Linear::load_split(&mut w, &format!("{p}.self_attn.q_proj"), h, n_heads * hd, false, Split::Rows, quant)?,
                    o: Linear::load_split(&mut w, &format!("{p}.self_attn.o_proj"), n_heads * hd, h, false, Split::Cols, quant)?,
                    q_norm: RmsNorm::load(&mut w, &format!("{p}.self_attn.q_norm"), hd, eps)?,
                    kv,
                    rope: cfg.rope(is_full, hd, config.path)?,
                    eps,
                };
                let moe = match moe {
                    Some(shape) => Some(load_moe(&mut w, &p, i as u32, &cfg, shape, quant)?),
                    None => None,
                };
                let per_layer = match d_pl > 0 {
                    true => Some(PerLayerGate {
                        gate: Linear::load(&mut w, &format!("{p}.per_layer_input_gate"), h, d_pl, false, quant)?,
                        projection: Linear::load(&mut w, &format!("{p}.per_layer_projection"), d_pl, h, false, quant)?,
                        norm: RmsNorm::load(&mut w, &format!("{p}.post_per_layer_input_norm"), h, eps)?,
                    }),
                    false => None,
                };
                Ok(Block {
                    attn,
                    mlp: Mlp::load_with(&mut w, &format!("{p}.mlp"), h, inter, false, Activation::GeluApprox, quant)?,
                    moe,
                    per_layer,
                    input_norm: RmsNorm::load(&mut w, &format!("{p}.input_layernorm"), h, eps)?,
                    post_attn_norm: RmsNorm::load(&mut w, &format!("{p}.post_attention_layernorm"), h, eps)?,
                    pre_ffn_norm: RmsNorm::load(&mut w, &format!("{p}.pre_feedforward_layernorm"), h, eps)?,
                    post_ffn_norm: RmsNorm::load(&mut w, &format!("{p}.post_feedforward_layernorm"), h, eps)?,
                    layer_scalar: w.take_shaped(&format!("{p}.layer_scalar"), &[1])?,
                    full: is_full,
                })
            })?;
            layers.push(block);
        }
        let embed = Embedding::load(&mut w, "model.embed_tokens", cfg.vocab_size, h, quant)?;
        let per_layer = match d_pl > 0 {
            true => {
                let n = cfg.num_hidden_layers * d_pl;
                Some(PerLayerInputs {
                    embed: Embedding::load(&mut w, "model.embed_tokens_per_layer", cfg.vocab_size_per_layer_input, n, quant)?,
                    projection: Linear::load(&mut w, "model.per_layer_model_projection", h, n, false, quant)?,
                    norm: RmsNorm::load(&mut w, "model.per_layer_projection_norm", d_pl, eps)?,
                })
            }
            false => None,
        };
        let (norm, lm_head) = placement.run_head(full.len(), || {
            let head = if cfg.tie_word_embeddings { None } else { Some(Linear::load(&mut w, "lm_head", h, cfg.vocab_size, false, quant)?) };
            Ok((RmsNorm::load(&mut w, "model.norm", h, eps)?, head))
        })?;
        if cfg.tie_word_embeddings {
            w.discard(|k| k.starts_with("lm_head."));
        }
        let mut layout = cfg.kv_layout()?;
        layout.kv_heads = kv_heads_per_rank(layout.kv_heads, ranks).unwrap_or(layout.kv_heads);
        layout.query_heads = (layout.query_heads / ranks).max(1);
        // This rank's caches: its layers that keep keys and values of their own.
        let own = |i: usize| i.min(first_shared);
        layout.kinds = layout.kinds[own(stage.layers.start)..own(stage.layers.end)].to_vec();
        let shared = (0..kv_sources.len()).map(|i| kv_sources.iter().enumerate().any(|(j, &src)| src == i && j != i)).collect();
        let model = Gemma4Text { embed, per_layer, layers, kv_sources, shared, norm, lm_head, placement, stage, layout, cfg };
        w.finish()?;
        Ok(model)
    }
}

/// The text model's config of a `gemma4` checkpoint (its `text_config`, with
/// the top-level vocabulary size and mlx-lm's head defaults).
pub fn text_config(c: &ConfigFile) -> Result<Value> {
    let mut text = match c.value.get("text_config") {
        Some(Value::Object(t)) => t.clone(),
        None | Some(Value::Null) => Default::default(),
        Some(_) => return Err(c.error("invalid config: field `text_config` must be an object")),
    };
    text.insert("vocab_size".into(), c.value.get("vocab_size").cloned().unwrap_or(Value::from(262_144)));
    text.entry("num_attention_heads").or_insert(Value::from(8));
    text.entry("num_key_value_heads").or_insert(Value::from(1));
    Ok(Value::Object(text))
}

/// The text model's name for a tensor of a `gemma4` checkpoint (mlx-lm's
/// sanitize): the language model's tensors under `model.`/`lm_head`, the
/// vision and audio towers dropped.
pub fn text_tensor_name(name: &str) -> Option<String> {
    let stripped = name.strip_prefix("model.");
    let rest = stripped.unwrap_or(name);
    let towers = ["vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision", "vision_embedder"];
    if towers.iter().any(|t| rest.starts_with(t)) {
        return None;
    }
    Some(match (stripped, rest.strip_prefix("language_model.")) {
        // HF: model.language_model.X is the text model's model.X.
        (Some(_), Some(inner)) => format!("model.{inner}"),
        // mlx-lm's own: language_model.model.X, language_model.lm_head.
        (None, Some(inner)) => inner.to_string(),
        _ => name.to_string(),
    })
}

/// The layer number of a tensor name (`model.layers.N....`).
fn layer_of(name: &str) -> Option<usize> {
    name.split("layers.").nth(1)?.split('.').next()?.parse().ok()
}

fn load_moe(w: &mut Weights, p: &str, layer: u32, cfg: &Gemma4TextConfig, (e, k, inter): (i32, i32, i32), quant: &QuantConfig) -> Result<Moe> {
    let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
    split_fused_experts(w, p, "experts.switch_glu", e, inter, h)?;
    // The experts as the shared MoE code reads them (the routing fields are
    // Gemma's own, below, and unused there).
    let spec = MoeSpec {
        num_experts: e,
        top_k: k,
        expert_hidden: inter,
        norm_topk_prob: false,
        router: Router::TopKLastThenSoftmax,
        shared_expert_hidden: None,
        hf_expert_names: HF_GLU_NAMES,
        flatten_tokens: false,
        module: "",
        parts: MoeParts { router_name: "router.proj", router_bias: false, switch: "experts.switch_glu", expert_bias: false, activation: GluActivation::GeluApprox },
    };
    let scale = w.take_shaped(&format!("{p}.router.scale"), &[h])?;
    let router_proj = Linear::load(w, &format!("{p}.router.proj"), h, e, false, quant)?;
    // scale * hidden^-0.5, once (mlx-lm computes the same product at every call).
    let router_norm = times(&scale, (h as f64).powf(-0.5))?;
    let experts = Experts::load(w, p, layer, h, &spec, quant)?;
    experts.guess_with(Guesser { proj: router_proj.clone(), norm: Some((router_norm.clone(), eps)), top_k: k });
    Ok(Moe {
        router_proj,
        router_norm,
        per_expert_scale: w.take_shaped(&format!("{p}.router.per_expert_scale"), &[e])?,
        top_k: k,
        eps,
        experts,
        pre_norm: RmsNorm::load(w, &format!("{p}.pre_feedforward_layernorm_2"), h, eps)?,
        post_norm_1: RmsNorm::load(w, &format!("{p}.post_feedforward_layernorm_1"), h, eps)?,
        post_norm_2: RmsNorm::load(w, &format!("{p}.post_feedforward_layernorm_2"), h, eps)?,
        reduce: w.tensor_parallel().cloned(),
    })
}

impl Moe {
    /// The routed experts' mixed output for `h`, routed on it and fed to the
    /// experts through their own norm.
    fn forward(&self, h: &Array) -> Result<Array> {
        let normed = fast::rms_norm(h, Some(&self.router_norm), self.eps)?;
        let scores = self.router_proj.forward(&normed)?;
        let e = self.per_expert_scale.dim(0)?;
        let inds = ops::argpartition(&scores, -self.top_k, -1)?;
        let mut stop = inds.shape();
        let n = stop.len();
        let mut start = vec![0; n];
        start[n - 1] = e - self.top_k;
        stop[n - 1] = e;
        let inds = ops::slice(&inds, &start, &stop, &vec![1; n])?;
        let weights = ops::softmax(&ops::take_along_axis(&scores, &inds, -1)?, &[-1], false)?;
        let weights = ops::multiply(&weights, &ops::take(&self.per_expert_scale, &inds, 0)?)?;
        let y = self.experts.forward(&self.pre_norm.forward(h)?, &inds)?;
        let mixed = ops::sum(&ops::multiply(&ops::expand_dims(&weights, &[-1])?, &y)?, &[-2], false)?;
        Ok(match &self.reduce {
            Some(group) => group.all_sum(&mixed)?,
            None => mixed,
        })
    }
}

impl Attention {
    /// `x` [B, L, hidden] attending through `cache` (its own, kept for later
    /// layers when `keep`, or the one of the layer it shares, which has just
    /// attended this step), at `positions`.
    fn forward(&self, x: &Array, cache: Target, masks: &StepMemo, window: Option<i32>, positions: &crate::kv::Positions, keep: bool) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let heads = |a: Array, n: i32| -> Result<Array> { Ok(ops::reshape(&a, &[b, l, n, self.head_dim])?) };
        let t = |a: &Array| -> Result<Array> { Ok(ops::transpose_axes(a, &[0, 2, 1, 3])?) };
        let q = self.q_norm.forward(&heads(self.q.forward(x)?, self.n_heads)?)?;
        let q = self.rope.forward(&t(&q)?, positions)?;
        let args = AttendArgs { scale: 1.0, window, sinks: None, keep };
        let out = match (cache, &self.kv) {
            (Target::Own(cache), Some(kv)) => {
                let keys = heads(kv.k.forward(x)?, self.n_kv_heads)?;
                let values = match &kv.v {
                    Some(v) => heads(v.forward(x)?, self.n_kv_heads)?,
                    None => keys.clone(),
                };
                let keys = self.rope.forward(&t(&kv.k_norm.forward(&keys)?)?, positions)?;
                let values = t(&fast::rms_norm(&values, None, self.eps)?)?;
                cache.attend(&q, &keys, &values, &args, masks)?
            }
            (Target::Shared(cache), None) => cache.attend_shared(&q, &args)?,
            _ => return Err(Error::Internal("gemma4: a layer's keys and values do not match its cache")),
        };
        self.o.forward(&ops::reshape(&t(&out)?, &[b, l, -1])?)
    }
}

/// Where a layer's attention goes: its own cache, or the one it shares.
enum Target<'a> {
    Own(&'a mut LayerCache),
    Shared(&'a LayerCache),
}

impl LanguageModel for Gemma4Text {
    fn forward(&self, tokens: &Array, cache: &mut ModelCache) -> Result<Array> {
        let x0 = self.embed.forward(tokens)?;
        let h = times(&x0, (self.cfg.hidden_size as f64).sqrt())?;
        let per_layer_inputs = match &self.per_layer {
            Some(pl) => {
                let (n, d) = (self.cfg.num_hidden_layers, self.cfg.hidden_size_per_layer_input);
                let embedded = times(&pl.embed.forward(tokens)?, (d as f64).sqrt())?;
                let embedded = ops::unflatten(&embedded, -1, &[n, d])?;
                let projected = times(&pl.projection.forward(&h)?, (self.cfg.hidden_size as f64).powf(-0.5))?;
                let projected = pl.norm.forward(&ops::unflatten(&projected, -1, &[n, d])?)?;
                Some(times(&ops::add(&projected, &embedded)?, 2f64.powf(-0.5))?)
            }
            None => None,
        };
        let start = self.stage.layers.start;
        let (caches, masks) = cache.for_forward();
        // Rope positions of each of this rank's layers with a cache, before this step appends.
        let positions: Vec<crate::kv::Positions> = caches.iter().map(|c| c.positions(masks)).collect::<Result<_>>()?;
        let mut apply = |i: usize, h: Array, caches: &mut [LayerCache], masks: &StepMemo| -> Result<Array> {
            let layer = &self.layers[i - start];
            // Caches are this rank's, from its first layer.
            let src = self.kv_sources[i] - start;
            let window = (!layer.full).then_some(self.cfg.sliding_window);
            self.placement.run(i, || {
                let target = if src == i - start { Target::Own(&mut caches[src]) } else { Target::Shared(&caches[src]) };
                let r = layer.attn.forward(&layer.input_norm.forward(&h)?, target, masks, window, &positions[src], self.shared[i])?;
                let hh = ops::add(&h, &layer.post_attn_norm.forward(&r)?)?;
                let ff = match &layer.moe {
                    Some(moe) => {
                        let dense = moe.post_norm_1.forward(&layer.mlp.forward(&layer.pre_ffn_norm.forward(&hh)?)?)?;
                        let routed = moe.post_norm_2.forward(&moe.forward(&hh)?)?;
                        ops::add(&dense, &routed)?
                    }
                    None => layer.mlp.forward(&layer.pre_ffn_norm.forward(&hh)?)?,
                };
                let mut out = ops::add(&hh, &layer.post_ffn_norm.forward(&ff)?)?;
                if let (Some(g), Some(inputs)) = (&layer.per_layer, &per_layer_inputs) {
                    let this = ops::squeeze(&ops::slice_axis(inputs, 2, i as i32, i as i32 + 1)?, &[2])?;
                    let gate = ops::multiply(&gelu_approx_compiled(&g.gate.forward(&out)?)?, &this)?;
                    out = ops::add(&out, &g.norm.forward(&g.projection.forward(&gate)?)?)?;
                }
                Ok(ops::multiply(&out, &layer.layer_scalar)?)
            })
        };
        let (h, pending) = self.stage.run(h, |h| self.stage.apply_layers(caches, masks, h, &mut apply))?;
        if let Some(p) = pending {
            cache.keep_pending(p);
        }
        self.placement.run_head(self.kv_sources.len(), || {
            let logits = self.embed.logits(self.lm_head.as_ref(), &self.norm.forward(&h)?)?;
            match self.cfg.final_logit_softcapping {
                // tanh(x / cap) * cap
                Some(cap) => {
                    let c = ops::scalar_as(cap, logits.dtype())?;
                    Ok(ops::multiply(&ops::tanh(&ops::divide(&logits, &c)?)?, &c)?)
                }
                None => Ok(logits),
            }
        })
    }

    fn kv_layout(&self) -> KvLayout {
        self.layout.clone()
    }
}
