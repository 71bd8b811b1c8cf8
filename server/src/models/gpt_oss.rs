//! gpt-oss: attention with biases and learned sinks, sliding-window and full
//! layers alternating (`layer_types`), YaRN rope, and every layer's
//! feed-forward a MoE whose `router` and experts carry biases, routed top-k on
//! the logits with a softmax over the chosen, through the clamped SwiGLU.
//! Checkpoints as mlx-lm writes them (mlx-community's: separate gate and up
//! stacks, experts often in mxfp4); the original fused `gate_up_proj` layout
//! needs `mlx_lm.convert` first.

use serde::Deserialize;

use super::attention::{AttentionSpec, QkNorm};
use super::config::{ConfigFile, RopeScaling};
use super::decoder::{DecoderSpec, RopeSpec};
use super::moe::{MoeParts, MoeSpec, Router, HF_GLU_NAMES};
use super::switch::GluActivation;
use super::weights::Weights;
use crate::error::Result;
use mlx_rs_safe::{ops, Array, Dtype};

/// config.json's fields, with mlx-lm's defaults (gpt-oss-20b's shapes).
#[derive(Debug, Deserialize)]
struct GptOssConfig {
    #[serde(default = "d_layers")]
    num_hidden_layers: i32,
    #[serde(default = "d_experts")]
    num_local_experts: i32,
    #[serde(default = "d_top_k")]
    num_experts_per_tok: i32,
    #[serde(default = "d_vocab")]
    vocab_size: i32,
    #[serde(default = "d_eps")]
    rms_norm_eps: f32,
    #[serde(default = "d_hidden")]
    hidden_size: i32,
    #[serde(default = "d_hidden")]
    intermediate_size: i32,
    #[serde(default = "d_head_dim")]
    head_dim: i32,
    #[serde(default = "d_heads")]
    num_attention_heads: i32,
    #[serde(default = "d_kv_heads")]
    num_key_value_heads: i32,
    #[serde(default = "d_window")]
    sliding_window: i32,
    #[serde(default = "d_theta")]
    rope_theta: f32,
    layer_types: Option<Vec<String>>,
}

fn d_layers() -> i32 { 36 }
fn d_experts() -> i32 { 128 }
fn d_top_k() -> i32 { 4 }
fn d_vocab() -> i32 { 201_088 }
fn d_eps() -> f32 { 1e-5 }
fn d_hidden() -> i32 { 2880 }
fn d_head_dim() -> i32 { 64 }
fn d_heads() -> i32 { 64 }
fn d_kv_heads() -> i32 { 8 }
fn d_window() -> i32 { 128 }
fn d_theta() -> f32 { 150_000.0 }

/// gpt-oss's SwiGLU clamp and slope (mlx-lm's SwigluOAI defaults).
const SWIGLU: GluActivation = GluActivation::SwigluOai { alpha: 1.702, limit: 7.0 };

pub fn spec(config: &ConfigFile) -> Result<DecoderSpec> {
    let c: GptOssConfig = config.parse()?;
    let layers = c.num_hidden_layers as usize;
    // mlx-lm's default: sliding and full alternating, sliding first.
    let types = c.layer_types.unwrap_or_else(|| ["sliding_attention", "full_attention"].iter().cycle().take(layers).map(|s| s.to_string()).collect());
    if types.len() != layers {
        return Err(config.error(format!("layer_types has {} entries for {layers} layers", types.len())));
    }
    let windows = types
        .iter()
        .map(|t| match t.as_str() {
            "sliding_attention" => Ok(Some(c.sliding_window)),
            "full_attention" => Ok(None),
            other => Err(config.error(format!("layer_types: {other:?} is neither \"sliding_attention\" nor \"full_attention\""))),
        })
        .collect::<Result<Vec<_>>>()?;
    if c.sliding_window < 1 {
        return Err(config.error(format!("sliding_window must be positive, got {}", c.sliding_window)));
    }
    let scaling = RopeScaling::read(config, "rope_scaling", (c.head_dim / 2) as usize, None)?;
    Ok(DecoderSpec {
        vocab_size: c.vocab_size,
        hidden_size: c.hidden_size,
        num_layers: c.num_hidden_layers,
        intermediate_size: c.intermediate_size,
        attention: AttentionSpec {
            n_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            qkv_bias: true,
            o_bias: true,
            qk_norm: QkNorm::None,
            scale: None,
            fused_qkv: false,
            sinks: true,
        },
        mlp_bias: false,
        rms_norm_eps: c.rms_norm_eps,
        rope: RopeSpec { theta: c.rope_theta, traditional: false, scaling, dims: c.head_dim },
        fused_gate_up: false,
        tie_word_embeddings: false,
        moe: Some(MoeSpec {
            num_experts: c.num_local_experts,
            top_k: c.num_experts_per_tok,
            expert_hidden: c.intermediate_size,
            norm_topk_prob: false,
            router: Router::TopKLastThenSoftmax,
            shared_expert_hidden: None,
            hf_expert_names: HF_GLU_NAMES,
            flatten_tokens: false,
            module: "mlp",
            parts: MoeParts { router_name: "router", router_bias: true, switch: "experts", expert_bias: true, activation: SWIGLU },
        }),
        moe_layers: vec![true; layers],
        windows,
        sanitize: Some(sanitize),
    })
}

/// The original openai/gpt-oss layout, as mlx-lm's sanitize reads it: each
/// layer's experts as one `gate_up_proj` stack whose rows interleave gate and
/// up (even rows gate, odd rows up), in mxfp4 as `_blocks` (bytes: 16 per 32
/// values) and `_scales`, with `_bias`; `down_proj` likewise. Split into
/// mlx-lm's separate stacks. Checkpoints already in mlx-lm's layout pass through.
fn sanitize(w: &mut Weights, spec: &DecoderSpec) -> Result<()> {
    for i in 0..spec.num_layers {
        let p = format!("model.layers.{i}.mlp.experts");
        let openai_layout = ["gate_up_proj", "gate_up_proj_blocks"].iter().any(|n| w.contains(&format!("{p}.{n}")));
        if openai_layout && w.streaming().is_some() {
            return Err(crate::error::Error::Config(
                "--stream-experts reads experts where mlx-lm's layout puts them; this is openai's original gpt-oss layout, whose experts are re-laid out at load (convert it with mlx_lm.convert to stream them)".into(),
            ));
        }
        for (stored, fused) in [("gate_up_proj", true), ("down_proj", false)] {
            let base = format!("{p}.{stored}");
            let parts = [
                (format!("{base}_blocks"), "weight", true),
                (format!("{base}_scales"), "scales", false),
                (format!("{base}_bias"), "bias", false),
                (base.clone(), "weight", false),
            ];
            for (name, part, blocks) in parts {
                if !w.contains(&name) {
                    continue;
                }
                let mut a = w.take_unchecked(&name)?;
                if blocks {
                    // [.., rows, groups, 16] bytes -> [.., rows, groups * 4] packed words.
                    a = ops::flatten(&ops::view(&a, Dtype::Uint32)?, -2, -1)?;
                }
                if !fused {
                    w.insert(format!("{p}.down_proj.{part}"), a);
                    continue;
                }
                // Gate and up interleave along the output axis (-2; -1 for the bias).
                let axis = if part == "bias" { -1 } else { -2 };
                for (half, start) in [("gate_proj", 0), ("up_proj", 1)] {
                    let rows = every_other(&a, axis, start)?;
                    w.insert(format!("{p}.{half}.{part}"), rows);
                }
            }
        }
    }
    Ok(())
}

/// Every other entry of `a` along `axis` (negative), from `start`.
fn every_other(a: &Array, axis: i32, start: i32) -> Result<Array> {
    let shape = a.shape();
    let n = shape.len();
    let ax = (n as i32 + axis) as usize;
    let mut begin = vec![0; n];
    begin[ax] = start;
    let mut strides = vec![1; n];
    strides[ax] = 2;
    Ok(ops::contiguous(&ops::slice(a, &begin, &shape, &strides)?, false)?)
}
