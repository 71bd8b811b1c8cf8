//! The architectures a GGUF file may hold, as the model families we load: the
//! config.json each one's metadata amounts to, and the Hugging Face name of
//! each of its tensors (llama.cpp's converter renames them; this undoes it).

use mlx_rs_safe::io::GgufValue;
use serde_json::{json, Map, Value};

use super::Metadata;
use crate::error::Result;

/// One GGUF `general.architecture` and how it maps onto our families.
#[derive(Debug, Clone, Copy)]
pub struct Arch {
    /// `general.architecture`.
    pub gguf: &'static str,
    /// config.json's `model_type` (llama with experts becomes mixtral).
    pub model_type: &'static str,
    /// llama.cpp permutes the rows of q and k for the families it rotates
    /// pairwise (the Llama converter): undone at load.
    pub permute_qk: bool,
    /// Gemma's converter stores RMS norm weights as 1 + w (the model takes
    /// them so, see `Weights::norms_hold_one`).
    pub norms_hold_one: bool,
}

pub const ARCHES: &[Arch] = &[
    Arch { gguf: "llama", model_type: "llama", permute_qk: true, norms_hold_one: false },
    Arch { gguf: "qwen2", model_type: "qwen2", permute_qk: false, norms_hold_one: false },
    Arch { gguf: "qwen3", model_type: "qwen3", permute_qk: false, norms_hold_one: false },
    Arch { gguf: "qwen2moe", model_type: "qwen2_moe", permute_qk: false, norms_hold_one: false },
    Arch { gguf: "qwen3moe", model_type: "qwen3_moe", permute_qk: false, norms_hold_one: false },
    Arch { gguf: "olmoe", model_type: "olmoe", permute_qk: false, norms_hold_one: false },
    Arch { gguf: "phi3", model_type: "phi3", permute_qk: false, norms_hold_one: false },
    Arch { gguf: "gemma3", model_type: "gemma3_text", permute_qk: false, norms_hold_one: true },
];

impl Arch {
    pub fn find(name: &str) -> Option<Arch> {
        ARCHES.iter().copied().find(|a| a.gguf == name)
    }

    pub fn supported() -> String {
        ARCHES.iter().map(|a| a.gguf).collect::<Vec<_>>().join(", ")
    }

    /// The module holding a layer's sparse MoE (Mixtral's has its own name).
    fn moe_module(self, meta: &Metadata) -> &'static str {
        if self.gguf == "llama" && meta.experts() > 0 {
            "block_sparse_moe"
        } else {
            "mlp"
        }
    }

    /// The Hugging Face name of GGUF tensor `name` (None: not a tensor of this
    /// architecture). Rotary-factor tensors are read into the config instead.
    pub fn hf_name(self, name: &str, meta: &Metadata) -> Option<String> {
        let (stem, suffix) = name.rsplit_once('.')?;
        if !matches!(suffix, "weight" | "bias") {
            return None;
        }
        let top = match stem {
            "token_embd" => Some("model.embed_tokens"),
            "output_norm" => Some("model.norm"),
            "output" => Some("lm_head"),
            _ => None,
        };
        if let Some(top) = top {
            return Some(format!("{top}.{suffix}"));
        }
        let mut parts = stem.splitn(3, '.');
        let (Some("blk"), Some(layer), Some(part)) = (parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        layer.parse::<u32>().ok()?;
        let moe = self.moe_module(meta);
        let gemma = self.gguf == "gemma3";
        let hf: String = match part {
            "attn_norm" => "input_layernorm".into(),
            "attn_q" => "self_attn.q_proj".into(),
            "attn_k" => "self_attn.k_proj".into(),
            "attn_v" => "self_attn.v_proj".into(),
            "attn_qkv" if self.gguf == "phi3" => "self_attn.qkv_proj".into(),
            "attn_output" => "self_attn.o_proj".into(),
            "attn_q_norm" => "self_attn.q_norm".into(),
            "attn_k_norm" => "self_attn.k_norm".into(),
            // Gemma 3 has four norms per layer; llama.cpp names the one before the
            // MLP ffn_norm in every family.
            "ffn_norm" if gemma => "pre_feedforward_layernorm".into(),
            "ffn_norm" => "post_attention_layernorm".into(),
            "post_attention_norm" if gemma => "post_attention_layernorm".into(),
            "post_ffw_norm" if gemma => "post_feedforward_layernorm".into(),
            "ffn_gate" => "mlp.gate_proj".into(),
            // Phi-3's fused gate and up projection is stored as ffn_up.
            "ffn_up" if self.gguf == "phi3" => "mlp.gate_up_proj".into(),
            "ffn_up" => "mlp.up_proj".into(),
            "ffn_down" => "mlp.down_proj".into(),
            "ffn_gate_inp" => format!("{moe}.gate"),
            "ffn_gate_exps" => format!("{moe}.switch_mlp.gate_proj"),
            "ffn_up_exps" => format!("{moe}.switch_mlp.up_proj"),
            "ffn_down_exps" => format!("{moe}.switch_mlp.down_proj"),
            "ffn_gate_inp_shexp" => "mlp.shared_expert_gate".into(),
            "ffn_gate_shexp" => "mlp.shared_expert.gate_proj".into(),
            "ffn_up_shexp" => "mlp.shared_expert.up_proj".into(),
            "ffn_down_shexp" => "mlp.shared_expert.down_proj".into(),
            _ => return None,
        };
        Some(format!("model.layers.{layer}.{hf}.{suffix}"))
    }

    /// config.json as Hugging Face would write it for this model, from the
    /// metadata; `rope_factors` is the `rope_freqs`/`rope_factors_long` tensor
    /// where the file has one (read by the caller).
    pub fn config(self, meta: &Metadata, has_output: bool, vocab: i64, rope_factors: Option<Vec<f32>>) -> Result<Value> {
        let hidden = meta.arch_int("embedding_length")?;
        let heads = meta.arch_int("attention.head_count")?;
        let kv_heads = meta.arch_int_or("attention.head_count_kv", heads)?;
        let head_dim = meta.arch_int_or("attention.key_length", if heads > 0 { hidden / heads } else { 0 })?;
        let experts = meta.experts();
        let expert_ff = meta.arch_opt_int("expert_feed_forward_length")?;
        let ff = match meta.arch_opt_int("feed_forward_length")? {
            Some(ff) => ff,
            None => expert_ff.ok_or_else(|| meta.missing("feed_forward_length"))?,
        };
        let mut c = Map::new();
        let model_type = if self.gguf == "llama" && experts > 0 { "mixtral" } else { self.model_type };
        c.insert("model_type".into(), json!(model_type));
        c.insert("hidden_size".into(), json!(hidden));
        c.insert("num_hidden_layers".into(), json!(meta.arch_int("block_count")?));
        c.insert("intermediate_size".into(), json!(ff));
        c.insert("num_attention_heads".into(), json!(heads));
        c.insert("num_key_value_heads".into(), json!(kv_heads));
        c.insert("head_dim".into(), json!(head_dim));
        c.insert("rms_norm_eps".into(), json!(meta.arch_float("attention.layer_norm_rms_epsilon")?));
        c.insert("vocab_size".into(), json!(vocab));
        if let Some(theta) = meta.arch_opt_float("rope.freq_base")? {
            c.insert("rope_theta".into(), json!(theta));
        }
        if let Some(ctx) = meta.arch_opt_int("context_length")? {
            c.insert("max_position_embeddings".into(), json!(ctx));
        }
        c.insert("tie_word_embeddings".into(), json!(!has_output));
        if let Some(eos) = meta.opt_int("tokenizer.ggml.eos_token_id")? {
            c.insert("eos_token_id".into(), json!(eos));
        }
        if let Some(bos) = meta.opt_int("tokenizer.ggml.bos_token_id")? {
            c.insert("bos_token_id".into(), json!(bos));
        }
        let scaling = meta.arch_opt_str("rope.scaling.type")?;
        let factor = meta.arch_opt_float("rope.scaling.factor")?;
        if let (Some("linear"), Some(factor)) = (scaling.as_deref(), factor) {
            c.insert("rope_scaling".into(), json!({"type": "linear", "factor": factor}));
        } else if let Some(kind) = scaling.as_deref().filter(|k| !matches!(*k, "none" | "linear")) {
            return Err(meta.error(format!("{}.rope.scaling.type {kind:?} is not supported", self.gguf)));
        }
        if let Some(factors) = rope_factors {
            // Llama 3.1's smoothed frequencies, stored by llama.cpp as a factor per
            // rotated pair rather than as the formula's parameters.
            c.insert("rope_scaling".into(), json!({"type": "freq_factors", "factors": factors}));
        }
        match self.gguf {
            "llama" if experts > 0 => {
                c.insert("num_local_experts".into(), json!(experts));
                c.insert("num_experts_per_tok".into(), json!(meta.arch_int("expert_used_count")?));
            }
            "qwen3moe" => {
                c.insert("num_experts".into(), json!(experts));
                c.insert("num_experts_per_tok".into(), json!(meta.arch_int("expert_used_count")?));
                c.insert("moe_intermediate_size".into(), json!(expert_ff.ok_or_else(|| meta.missing("expert_feed_forward_length"))?));
                c.insert("decoder_sparse_step".into(), json!(1));
                // llama.cpp always renormalizes Qwen3-MoE's top-k weights.
                c.insert("norm_topk_prob".into(), json!(true));
            }
            "qwen2moe" => {
                c.insert("num_experts".into(), json!(experts));
                c.insert("num_experts_per_tok".into(), json!(meta.arch_int("expert_used_count")?));
                c.insert("moe_intermediate_size".into(), json!(expert_ff.ok_or_else(|| meta.missing("expert_feed_forward_length"))?));
                c.insert("shared_expert_intermediate_size".into(), json!(meta.arch_int("expert_shared_feed_forward_length")?));
            }
            "olmoe" => {
                c.insert("num_experts".into(), json!(experts));
                c.insert("num_experts_per_tok".into(), json!(meta.arch_int("expert_used_count")?));
                c.insert("norm_topk_prob".into(), json!(false));
                if let Some(e) = expert_ff {
                    c.insert("intermediate_size".into(), json!(e));
                }
            }
            "phi3" => {
                let rot = meta.arch_int_or("rope.dimension_count", head_dim)?;
                c.insert("partial_rotary_factor".into(), json!(rot as f64 / head_dim.max(1) as f64));
                if let Some(Value::Object(s)) = c.get("rope_scaling").cloned() {
                    if s.get("type") == Some(&json!("freq_factors")) {
                        // Phi-3's long-context factors (rope_factors_long).
                        let orig = meta.arch_int("rope.scaling.original_context_length")?;
                        c.insert("original_max_position_embeddings".into(), json!(orig));
                        c.insert("rope_scaling".into(), json!({"type": "longrope", "long_factor": s["factors"], "short_factor": s["factors"]}));
                    }
                }
            }
            "gemma3" => {
                c.insert("sliding_window".into(), json!(meta.arch_int("attention.sliding_window")?));
                c.insert("rope_local_base_freq".into(), json!(10_000.0));
                c.insert("sliding_window_pattern".into(), json!(meta.sliding_window_period()?));
                // llama.cpp's Gemma 3 scales queries by 1/√head_dim, but by
                // 1/√(hidden/heads) in the 27B model (62 layers).
                let blocks = meta.arch_int("block_count")?;
                let scalar = if blocks == 62 { hidden / heads.max(1) } else { head_dim };
                c.insert("query_pre_attn_scalar".into(), json!(scalar));
            }
            _ => {}
        }
        Ok(Value::Object(c))
    }
}

impl Metadata<'_> {
    /// The number of routed experts (0: dense).
    pub fn experts(&self) -> i64 {
        self.arch_opt_int("expert_count").ok().flatten().unwrap_or(0)
    }

    /// Gemma 3's period of sliding-window layers (every n-th layer is global):
    /// `attention.sliding_window_pattern` as a number or as one flag per layer
    /// (true: sliding); llama.cpp's fixed 6 where the file says nothing.
    fn sliding_window_period(&self) -> Result<i64> {
        let key = "attention.sliding_window_pattern";
        if let Some(n) = self.arch_opt_int(key).ok().flatten() {
            return Ok(n);
        }
        let Some(flags) = self.numbers(&format!("gemma3.{key}"))? else {
            return Ok(6);
        };
        let period = flags.iter().position(|&f| f == 0.0).map_or(flags.len() as i64 + 1, |i| i as i64 + 1);
        let periodic = flags.iter().enumerate().all(|(i, &f)| (f == 0.0) == ((i as i64 + 1) % period == 0));
        if periodic {
            Ok(period)
        } else {
            Err(self.error(format!("gemma3.{key}: sliding layers that do not repeat with one period are not supported")))
        }
    }
}

/// A metadata value as an error message shows it.
pub fn describe(v: &GgufValue) -> String {
    match v {
        GgufValue::String(s) => format!("{s:?}"),
        GgufValue::Array(a) => format!("an array of {}", a.len()),
        other => format!("{other:?}"),
    }
}
