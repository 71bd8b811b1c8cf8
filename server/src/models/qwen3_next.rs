//! Qwen3-Next, Qwen3.5 and Qwen3.5-MoE: hybrid models whose layers are
//! Gated DeltaNet linear attention — a causal depthwise convolution, then the
//! gated delta rule over a fixed-size recurrent state ([`super::gated_delta`])
//! — with a gated full-attention layer every `full_attention_interval`
//! (sigmoid output gate, q/k norms, partial rope), and a dense MLP or a MoE
//! with a sigmoid-gated shared expert — mlx-lm's qwen3_next and qwen3_5, op
//! for op. Linear layers keep a [`KvKind::Recurrent`] state; full layers a
//! plain KV cache. `qwen3_5`/`qwen3_5_moe` checkpoints go through their text
//! model (`text_config`, `language_model` tensors).

use mlx_rs_safe::{ops, Array};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::config::{ConfigFile, RopeScaling};
use super::decoder::{FeedForward, RopeSpec};
use super::gated_delta;
use super::layers::{kv_heads_per_rank, Embedding, Linear, RmsNorm};
use super::mlp::Mlp;
use super::moe::{split_fused_experts, MoeParts, MoeSpec, Router, SparseMoe, HF_GLU_NAMES};
use super::pipeline::PipelineStage;
use super::placement::Placement;
use super::quant::QuantConfig;
use super::rope::Rope;
use super::weights::{row_segments_part, Split, Weights};
use super::{KvLayout, LanguageModel};
use crate::error::{Error, Result};
use crate::kv::{AttendArgs, KvKind, LayerCache, ModelCache, Positions, RecurrentStore, StepMemo};

/// The two generations differ in the linear layers' input projections, in
/// which layers are MoE and in one default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// qwen3_next: q, k, v, z interleaved per key head in one projection, b
    /// and a in another; MoE every `decoder_sparse_step` layers but
    /// `mlp_only_layers`.
    Next,
    /// qwen3_5(_moe): separate qkv, z, b and a projections; MoE on every layer
    /// when the model has experts.
    Qwen35,
}

/// The text model's config.json fields, with mlx-lm's defaults.
#[derive(Debug, Clone, Deserialize)]
pub struct Qwen3NextConfig {
    hidden_size: i32,
    num_hidden_layers: i32,
    #[serde(default)]
    intermediate_size: i32,
    num_attention_heads: i32,
    num_key_value_heads: i32,
    head_dim: Option<i32>,
    #[serde(default = "d_eps")]
    rms_norm_eps: f32,
    vocab_size: i32,
    linear_num_value_heads: i32,
    linear_num_key_heads: i32,
    linear_key_head_dim: i32,
    linear_value_head_dim: i32,
    #[serde(default = "d_conv")]
    linear_conv_kernel_dim: i32,
    #[serde(default = "d_interval")]
    full_attention_interval: i32,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    num_experts: i32,
    #[serde(default)]
    num_experts_per_tok: i32,
    #[serde(default = "d_one")]
    decoder_sparse_step: i32,
    #[serde(default)]
    shared_expert_intermediate_size: i32,
    #[serde(default)]
    moe_intermediate_size: i32,
    norm_topk_prob: Option<bool>,
    #[serde(default)]
    mlp_only_layers: Vec<i32>,
    rope_theta: Option<f32>,
    partial_rotary_factor: Option<f32>,
}

fn d_eps() -> f32 { 1e-6 }
fn d_conv() -> i32 { 4 }
fn d_interval() -> i32 { 4 }
fn d_one() -> i32 { 1 }

impl Qwen3NextConfig {
    fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("qwen3 hybrid: {m}")));
        if self.full_attention_interval < 1 {
            return bad(format!("full_attention_interval must be at least 1 (got {})", self.full_attention_interval));
        }
        if self.linear_num_key_heads < 1 || self.linear_num_value_heads % self.linear_num_key_heads != 0 {
            return bad(format!(
                "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                self.linear_num_value_heads, self.linear_num_key_heads
            ));
        }
        if self.linear_conv_kernel_dim < 2 {
            return bad(format!("linear_conv_kernel_dim must be at least 2 (got {})", self.linear_conv_kernel_dim));
        }
        if self.num_experts > 0 && !(1..=self.num_experts).contains(&self.num_experts_per_tok) {
            return bad(format!("num_experts_per_tok ({}) must be between 1 and num_experts ({})", self.num_experts_per_tok, self.num_experts));
        }
        if self.num_experts > 0 && self.decoder_sparse_step < 1 {
            return bad(format!("decoder_sparse_step must be at least 1 (got {})", self.decoder_sparse_step));
        }
        Ok(())
    }

    fn head_dim(&self) -> i32 {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Layer `i` is linear attention (all but every `full_attention_interval`-th).
    fn is_linear(&self, i: usize) -> bool {
        (i as i32 + 1) % self.full_attention_interval != 0
    }

    /// What one of `ranks` tensor-parallel ranks runs: its share of the
    /// linear layers' key and value heads and of the attention heads (the
    /// shapes of the files stay the whole config's).
    fn sharded(&self, ranks: i32) -> Result<Qwen3NextConfig> {
        let heads = [self.linear_num_key_heads, self.linear_num_value_heads, self.num_attention_heads, self.num_key_value_heads];
        // KV heads fewer than the ranks are repeated (as mlx-lm's shard does).
        let kv_per_rank = kv_heads_per_rank(heads[3], ranks);
        if heads[..3].iter().any(|h| h % ranks != 0) || kv_per_rank.is_none() {
            return Err(Error::Config(format!(
                "tensor parallelism over {ranks} ranks: {} linear key heads, {} linear value heads, {} query heads and {} KV heads do not all divide among the ranks (KV heads may also divide the ranks); use --distributed pipeline",
                heads[0], heads[1], heads[2], heads[3]
            )));
        }
        Ok(Qwen3NextConfig {
            linear_num_key_heads: self.linear_num_key_heads / ranks,
            linear_num_value_heads: self.linear_num_value_heads / ranks,
            num_attention_heads: self.num_attention_heads / ranks,
            num_key_value_heads: kv_per_rank.unwrap_or(self.num_key_value_heads),
            ..self.clone()
        })
    }

    fn is_moe(&self, i: usize, family: Family) -> bool {
        match family {
            Family::Qwen35 => self.num_experts > 0,
            Family::Next => {
                !self.mlp_only_layers.contains(&(i as i32)) && self.num_experts > 0 && (i as i32 + 1) % self.decoder_sparse_step == 0
            }
        }
    }

    /// What the model's cache holds: a recurrent state on linear layers, keys
    /// and values on full ones.
    pub fn kv_layout(&self) -> Result<KvLayout> {
        self.check()?;
        Ok(KvLayout {
            kinds: (0..self.num_hidden_layers as usize).map(|i| if self.is_linear(i) { self.recurrent_kind() } else { KvKind::Dense }).collect(),
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim(),
            query_heads: self.num_attention_heads,
            attention_sinks: false,
            fixed_kv: None,
        })
    }

    /// A linear layer's cache kind: its state's bytes per sequence (the
    /// convolution window at 16 bits, the float32 recurrent matrix).
    fn recurrent_kind(&self) -> KvKind {
        let (nk, nv, dk, dv) = (self.linear_num_key_heads as u64, self.linear_num_value_heads as u64, self.linear_key_head_dim as u64, self.linear_value_head_dim as u64);
        let window = (self.linear_conv_kernel_dim as u64 - 1) * (2 * nk * dk + nv * dv) * 2;
        let matrix = nv * dv * dk * 4;
        KvKind::Recurrent { state_bytes: u32::try_from(window + matrix).unwrap_or(u32::MAX) }
    }

    fn moe_spec(&self, family: Family) -> MoeSpec {
        MoeSpec {
            num_experts: self.num_experts,
            top_k: self.num_experts_per_tok,
            expert_hidden: self.moe_intermediate_size,
            norm_topk_prob: self.norm_topk_prob.unwrap_or(family == Family::Qwen35),
            router: Router::SoftmaxTopKLast,
            shared_expert_hidden: Some(self.shared_expert_intermediate_size),
            hf_expert_names: HF_GLU_NAMES,
            flatten_tokens: false,
            module: "mlp",
            parts: MoeParts::STANDARD,
        }
    }
}

/// The text config of a `qwen3_5`/`qwen3_5_moe` checkpoint: its
/// `text_config` where there is one, else the config itself, with the rope
/// of its `rope_parameters` (mlx-lm's default when absent: theta 100000, a
/// quarter of each head rotated, no scaling).
pub fn text_config(c: &ConfigFile) -> Result<Value> {
    let mut text: Map<String, Value> = match c.value.get("text_config") {
        Some(Value::Object(t)) => t.clone(),
        None | Some(Value::Null) => c.value.as_object().cloned().unwrap_or_default(),
        Some(_) => return Err(c.error("invalid config: field `text_config` must be an object")),
    };
    let rope = match text.get("rope_parameters") {
        Some(Value::Object(p)) => p.clone(),
        None | Some(Value::Null) => serde_json::json!({"type": "default", "rope_theta": 100_000.0, "partial_rotary_factor": 0.25})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        Some(_) => return Err(c.error("invalid config: field `rope_parameters` must be an object")),
    };
    text.insert("rope_theta".into(), rope.get("rope_theta").cloned().unwrap_or(Value::from(100_000.0)));
    text.insert("partial_rotary_factor".into(), rope.get("partial_rotary_factor").cloned().unwrap_or(Value::from(0.25)));
    text.insert("rope_scaling".into(), Value::Object(rope));
    Ok(Value::Object(text))
}

/// The text model's name for a tensor of a `qwen3_5` checkpoint (mlx-lm's
/// sanitize): `language_model.` and Hugging Face's `model.language_model.`
/// prefixes taken off, the vision tower and the multi-token-prediction head
/// dropped.
pub fn text_tensor_name(name: &str) -> Option<String> {
    if name.starts_with("vision_tower") || name.starts_with("model.visual") || name.starts_with("mtp.") {
        return None;
    }
    Some(match (name.strip_prefix("model.language_model."), name.strip_prefix("language_model.")) {
        (Some(inner), _) => format!("model.{inner}"),
        (None, Some(inner)) => inner.to_string(),
        _ => name.to_string(),
    })
}

/// A linear layer's input projections.
enum InProjections {
    /// Qwen3-Next: [q k v z] per key head in one matrix, [b a] per key head in another.
    Interleaved { qkvz: Linear, ba: Linear },
    /// Qwen3.5: each its own matrix.
    Separate { qkv: Linear, z: Linear, b: Linear, a: Linear },
}

/// A Gated DeltaNet layer.
struct DeltaNet {
    proj: InProjections,
    /// Depthwise convolution weights [channels, kernel, 1].
    conv: Array,
    dt_bias: Array,
    a_log: Array,
    norm_weight: Array,
    out: Linear,
    eps: f32,
    nk: i32,
    nv: i32,
    dk: i32,
    dv: i32,
    kernel: i32,
}

impl DeltaNet {
    /// Loads the layer at `p`: the whole layer as `cfg` gives it, or under
    /// tensor parallelism this rank's run of its heads (`local`: the rank's
    /// config), split as mlx-lm's Qwen3.5 `shard` splits it: every input
    /// projection by output rows (the fused q/k/v rows and the convolution's
    /// channels segment by segment), the output projection by input columns.
    fn load(w: &mut Weights, p: &str, cfg: &Qwen3NextConfig, local: &Qwen3NextConfig, family: Family, quant: &QuantConfig) -> Result<DeltaNet> {
        let h = cfg.hidden_size;
        let (nk, nv, dk, dv) = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim);
        let (key_dim, value_dim) = (nk * dk, nv * dv);
        let channels = 2 * key_dim + value_dim;
        let segments = [key_dim, key_dim, value_dim];
        let group = w.tensor_parallel().cloned();
        let kernel = cfg.linear_conv_kernel_dim;
        let rows = |w: &mut Weights, name: &str, out: i32| Linear::load_split(w, &format!("{p}.{name}"), h, out, false, Split::Rows, quant);
        let proj = match family {
            // Rows grouped by key head ([q k v z] and [b a] per head): split by heads.
            Family::Next => InProjections::Interleaved { qkvz: rows(w, "in_proj_qkvz", 2 * key_dim + 2 * value_dim)?, ba: rows(w, "in_proj_ba", 2 * nv)? },
            Family::Qwen35 => {
                let qkv = Linear::load(w, &format!("{p}.in_proj_qkv"), h, channels, false, quant)?;
                InProjections::Separate {
                    qkv: match &group {
                        Some(g) => qkv.rows_by_segments(&segments, g)?,
                        None => qkv,
                    },
                    z: rows(w, "in_proj_z", value_dim)?,
                    b: rows(w, "in_proj_b", nv)?,
                    a: rows(w, "in_proj_a", nv)?,
                }
            }
        };
        let conv_name = format!("{p}.conv1d.weight");
        if hf_conv_layout(w, &conv_name) {
            // Hugging Face's [channels, 1, kernel] → MLX's [channels, kernel, 1].
            let raw = w.take_unchecked(&conv_name)?;
            w.insert(conv_name.clone(), ops::moveaxis(&raw, 2, 1)?);
        }
        let conv = w.take_shaped(&conv_name, &[channels, kernel, 1])?;
        Ok(DeltaNet {
            proj,
            conv: match &group {
                Some(g) => row_segments_part(&conv, &segments, g)?,
                None => conv,
            },
            dt_bias: w.take_split(&format!("{p}.dt_bias"), &[nv], Split::Rows)?,
            a_log: w.take_split(&format!("{p}.A_log"), &[nv], Split::Rows)?,
            norm_weight: w.take_shaped(&format!("{p}.norm.weight"), &[dv])?,
            out: Linear::load_split(w, &format!("{p}.out_proj"), value_dim, h, false, Split::Cols, quant)?,
            eps: cfg.rms_norm_eps,
            nk: local.linear_num_key_heads,
            nv: local.linear_num_value_heads,
            dk,
            dv,
            kernel,
        })
    }

    /// `x` [B, S, hidden] through the layer, its state in `cache`.
    fn forward(&self, x: &Array, cache: &mut RecurrentStore) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let (nk, nv, dk, dv) = (self.nk, self.nv, self.dk, self.dv);
        let (mixed, z, beta_in, a) = match &self.proj {
            InProjections::Interleaved { qkvz, ba } => {
                // mlx-lm's fix_query_key_value_ordering: per key head [q k v z], [b a].
                let qkvz = ops::reshape(&qkvz.forward(x)?, &[b, l, nk, -1])?;
                let ba = ops::reshape(&ba.forward(x)?, &[b, l, nk, -1])?;
                let r = nv / nk;
                let [q, k, v, z] = ops::split_sections_into(&qkvz, &[dk, 2 * dk, 2 * dk + r * dv], -1)?;
                let [bb, aa] = ops::split_sections_into(&ba, &[r], -1)?;
                let flat = |t: &Array| ops::reshape(t, &[b, l, -1]);
                let mixed = ops::concatenate(&[&flat(&q)?, &flat(&k)?, &flat(&ops::reshape(&v, &[b, l, -1, dv])?)?], -1)?;
                (mixed, ops::reshape(&z, &[b, l, -1, dv])?, ops::reshape(&bb, &[b, l, nv])?, ops::reshape(&aa, &[b, l, nv])?)
            }
            InProjections::Separate { qkv, z, b: bp, a } => {
                (qkv.forward(x)?, ops::reshape(&z.forward(x)?, &[b, l, nv, dv])?, bp.forward(x)?, a.forward(x)?)
            }
        };
        let channels = self.conv.dim(0)?;
        let (conv_state, ssm_state) = cache.states();
        let conv_state = match conv_state {
            Some(c) => c.clone(),
            None => ops::zeros(&[b, self.kernel - 1, channels], x.dtype())?,
        };
        let ssm_state = ssm_state.cloned();
        let conv_input = ops::concatenate(&[&conv_state, &mixed], 1)?;
        let total = conv_input.dim(1)?;
        let kept = ops::contiguous(&ops::slice_axis(&conv_input, 1, total - (self.kernel - 1), total)?, false)?;
        let conv_out = gated_delta::silu(&ops::conv1d(&conv_input, &self.conv, 1, 0, 1, channels)?)?;
        let key_dim = nk * dk;
        let [q, k, v] = ops::split_sections_into(&conv_out, &[key_dim, 2 * key_dim], -1)?;
        let q = ops::reshape(&q, &[b, l, nk, dk])?;
        let k = ops::reshape(&k, &[b, l, nk, dk])?;
        let v = ops::reshape(&v, &[b, l, nv, dv])?;
        let (q, k) = gated_delta::normalize_qk(&q, &k)?;
        let (out, state) = gated_delta::update(&q, &k, &v, &a, &beta_in, &self.a_log, &self.dt_bias, ssm_state.as_ref())?;
        cache.update(kept, state, l);
        let out = gated_delta::gated_rms_norm(&out, &z, &self.norm_weight, self.eps)?;
        self.out.forward(&ops::reshape(&out, &[b, l, -1])?)
    }
}

/// Whether the convolution weight `name` is in Hugging Face's layout
/// ([channels, 1, kernel]; mlx-lm's sanitize moves its axes).
fn hf_conv_layout(w: &Weights, name: &str) -> bool {
    w.shape_of(name).is_some_and(|s| s.len() == 3 && s[2] != 1)
}

/// A full-attention layer: queries with a sigmoid output gate beside them.
struct GatedAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
}

impl GatedAttention {
    /// Loads the layer at `p`, under tensor parallelism this rank's run of
    /// its heads (`local`: the rank's config): queries with their gates (one
    /// run of rows per head), keys and values by heads (repeated where fewer
    /// than the ranks), the output projection by input columns.
    fn load(w: &mut Weights, p: &str, cfg: &Qwen3NextConfig, local: &Qwen3NextConfig, norm: NormLoad, rope: Rope, quant: &QuantConfig) -> Result<GatedAttention> {
        let (h, hd, bias) = (cfg.hidden_size, cfg.head_dim(), cfg.attention_bias);
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        Ok(GatedAttention {
            q: Linear::load_split(w, &format!("{p}.q_proj"), h, nh * hd * 2, bias, Split::Rows, quant)?,
            k: Linear::load_kv_heads(w, &format!("{p}.k_proj"), h, nkv, hd, bias, quant)?,
            v: Linear::load_kv_heads(w, &format!("{p}.v_proj"), h, nkv, hd, bias, quant)?,
            o: Linear::load_split(w, &format!("{p}.o_proj"), nh * hd, h, bias, Split::Cols, quant)?,
            q_norm: norm(w, &format!("{p}.q_norm"), hd, cfg.rms_norm_eps)?,
            k_norm: norm(w, &format!("{p}.k_norm"), hd, cfg.rms_norm_eps)?,
            rope,
            n_heads: local.num_attention_heads,
            n_kv_heads: local.num_key_value_heads,
            head_dim: hd,
        })
    }

    fn forward(&self, x: &Array, cache: &mut LayerCache, masks: &StepMemo) -> Result<Array> {
        let s = x.shape();
        let (b, l) = (s[0], s[1]);
        let t = |a: &Array| -> Result<Array> { Ok(ops::transpose_axes(a, &[0, 2, 1, 3])?) };
        let q_gate = ops::reshape(&self.q.forward(x)?, &[b, l, self.n_heads, -1])?;
        let [queries, gate] = ops::split_into(&q_gate, -1)?;
        let gate = ops::reshape(&gate, &[b, l, -1])?;
        let queries = t(&self.q_norm.forward(&queries)?)?;
        let keys = t(&self.k_norm.forward(&ops::reshape(&self.k.forward(x)?, &[b, l, self.n_kv_heads, -1])?)?)?;
        let values = t(&ops::reshape(&self.v.forward(x)?, &[b, l, self.n_kv_heads, -1])?)?;
        let positions: Positions = cache.positions(masks)?;
        let queries = self.rope.forward(&queries, &positions)?;
        let keys = self.rope.forward(&keys, &positions)?;
        let args = AttendArgs { scale: (self.head_dim as f32).powf(-0.5), window: None, sinks: None, keep: false };
        let out = cache.attend(&queries, &keys, &values, &args, masks)?;
        let out = ops::reshape(&t(&out)?, &[b, l, -1])?;
        self.o.forward(&ops::multiply(&out, &ops::sigmoid(&gate)?)?)
    }
}

/// How the model's (1 + w)-style norms are read: as stored (mlx-lm's
/// layout), or with the one added (Hugging Face's, which mlx-lm's sanitize
/// adds it to).
type NormLoad = fn(&mut Weights, &str, i32, f32) -> Result<RmsNorm>;

enum Mixer {
    Linear(DeltaNet),
    Full(GatedAttention),
}

struct Block {
    input_norm: RmsNorm,
    mixer: Mixer,
    post_attn_norm: RmsNorm,
    mlp: FeedForward,
}

pub struct Qwen3Next {
    embed: Embedding,
    /// This rank's layers (all of them without pipeline parallelism).
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Option<Linear>,
    placement: Placement,
    stage: PipelineStage,
    layout: KvLayout,
}

impl Qwen3Next {
    pub fn load(config: &ConfigFile, family: Family, mut w: Weights, quant: &QuantConfig, placement: Placement) -> Result<Qwen3Next> {
        let cfg: Qwen3NextConfig = config.parse()?;
        // The layout checks the config: before any weight is taken. Under
        // tensor parallelism it is this rank's (its share of the heads).
        cfg.kv_layout()?;
        let local = cfg.sharded(w.tensor_parallel().map_or(1, |g| g.size() as i32))?;
        let mut layout = local.kv_layout()?;
        let stage = PipelineStage::of(w.sharding(), cfg.num_hidden_layers as usize)?.with_experts(w.streaming());
        // As mlx-lm's sanitize: the multi-token-prediction head and a tied head go.
        w.discard(|k| k.starts_with("mtp.") || k.contains(".mtp."));
        if cfg.tie_word_embeddings {
            w.discard(|k| k.starts_with("lm_head."));
        }
        let first_linear = (0..cfg.num_hidden_layers as usize).find(|&i| cfg.is_linear(i));
        let hf_layout = first_linear.is_some_and(|i| hf_conv_layout(&w, &format!("model.layers.{i}.linear_attn.conv1d.weight")));
        let norm: NormLoad = if hf_layout { RmsNorm::load_plus_one } else { RmsNorm::load };
        // Told apart on the whole model's first linear layer, before a pipeline
        // stage drops the other ranks' layers.
        w.discard(|k| stage.foreign(k));
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let hd = cfg.head_dim();
        let (Some(theta), Some(partial)) = (cfg.rope_theta, cfg.partial_rotary_factor) else {
            return Err(config.error("qwen3_next needs rope_theta and partial_rotary_factor"));
        };
        let rope_dims = (hd as f32 * partial) as i32;
        let scaling = RopeScaling::read(config, "rope_scaling", (rope_dims / 2) as usize, None)?;
        let rope_spec = RopeSpec { theta, traditional: false, scaling, dims: rope_dims };
        let mut layers = Vec::with_capacity(stage.layers.len());
        for i in stage.layers.clone() {
            let p = format!("model.layers.{i}");
            let block = placement.run(i, || {
                let mixer = match cfg.is_linear(i) {
                    true => Mixer::Linear(DeltaNet::load(&mut w, &format!("{p}.linear_attn"), &cfg, &local, family, quant)?),
                    false => Mixer::Full(GatedAttention::load(&mut w, &format!("{p}.self_attn"), &cfg, &local, norm, Rope::new(&rope_spec)?, quant)?),
                };
                let mlp = match cfg.is_moe(i, family) {
                    true => {
                        let spec = cfg.moe_spec(family);
                        split_fused_experts(&mut w, &format!("{p}.mlp"), "switch_mlp", spec.num_experts, spec.expert_hidden, h)?;
                        FeedForward::Moe(Box::new(SparseMoe::load(&mut w, &format!("{p}.mlp"), i as u32, h, spec, quant)?))
                    }
                    false => FeedForward::Dense(Mlp::load(&mut w, &format!("{p}.mlp"), h, cfg.intermediate_size, false, quant)?),
                };
                Ok(Block {
                    input_norm: norm(&mut w, &format!("{p}.input_layernorm"), h, eps)?,
                    mixer,
                    post_attn_norm: norm(&mut w, &format!("{p}.post_attention_layernorm"), h, eps)?,
                    mlp,
                })
            })?;
            layers.push(block);
        }
        let embed = Embedding::load(&mut w, "model.embed_tokens", cfg.vocab_size, h, quant)?;
        let (norm, lm_head) = placement.run_head(stage.layers.end, || {
            let head = if cfg.tie_word_embeddings { None } else { Some(Linear::load(&mut w, "lm_head", h, cfg.vocab_size, false, quant)?) };
            Ok((norm(&mut w, "model.norm", h, eps)?, head))
        })?;
        layout.kinds = layout.kinds[stage.layers.clone()].to_vec();
        let model = Qwen3Next { embed, layers, norm, lm_head, placement, stage, layout };
        w.finish()?;
        Ok(model)
    }
}

impl LanguageModel for Qwen3Next {
    fn forward(&self, tokens: &Array, cache: &mut ModelCache) -> Result<Array> {
        let start = self.stage.layers.start;
        let h = self.stage.forward(self.embed.forward(tokens)?, cache, |i, h, cache, masks| {
            let layer = &self.layers[i - start];
            self.placement.run(i, || {
                let x = layer.input_norm.forward(&h)?;
                let r = match &layer.mixer {
                    Mixer::Linear(net) => net.forward(&x, cache.recurrent()?)?,
                    Mixer::Full(attn) => attn.forward(&x, cache, masks)?,
                };
                let hh = ops::add(&h, &r)?;
                let x = layer.post_attn_norm.forward(&hh)?;
                Ok(ops::add(&hh, &layer.mlp.forward(&x)?)?)
            })
        })?;
        self.placement.run_head(self.stage.layers.end, || self.embed.logits(self.lm_head.as_ref(), &self.norm.forward(&h)?))
    }

    fn kv_layout(&self) -> KvLayout {
        self.layout.clone()
    }
}
