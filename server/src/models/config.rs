//! config.json, typed: the fields every decoder shares (read once, here), the
//! rope scaling variants, and a reader whose errors name the file and field.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::attention::{AttentionSpec, QkNorm};
use super::decoder::{DecoderSpec, RopeSpec};
use crate::error::{Error, Result};

/// A model's config.json, parsed as JSON; typed views are read from it.
pub struct ConfigFile<'a> {
    pub value: &'a Value,
    pub path: &'a Path,
}

impl ConfigFile<'_> {
    /// The fields of `T`; a missing field or one of the wrong type is named.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        serde_path_to_error::deserialize(self.value).map_err(|e| {
            let field = e.path().to_string();
            let message = e.into_inner().to_string();
            let message = if field == "." { message } else { format!("field `{field}`: {message}") };
            Error::model_file(self.path, format!("invalid config: {message}"))
        })
    }

    /// An error about this file.
    pub fn error(&self, message: impl Into<String>) -> Error {
        Error::model_file(self.path, message)
    }
}

/// Rotary scaling (`rope_scaling`, or `rope_parameters` in transformers ≥ 5):
/// the variants mlx-lm's `initialize_rope` builds that we support.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain rope (also `{"type": "default"}`).
    Default,
    /// Positions divided by `factor`.
    Linear { factor: f32 },
    /// Llama 3.1's frequency smoothing.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_max_position_embeddings: f32 },
    /// Phi-3's "su"/"longrope": per-frequency factors (the long ones are used),
    /// and the context lengths that fix the input scale.
    LongRope { long_factor: Vec<f32>, long_mscale: Option<f32>, max_position_embeddings: i32, original_max_position_embeddings: i32 },
    /// Each rotated pair's period multiplied by a stored factor: how GGUF files
    /// hold Llama 3.1's smoothed frequencies (`rope_freqs`; the type
    /// "freq_factors" is ours, written by the GGUF loader).
    FreqFactors { factors: Vec<f32> },
    /// Gemma 4's "proportional" rope: the first `partial_rotary_factor` of the
    /// head rotated at `factor` × base^(2i/head_dim), the rest not at all.
    Proportional { partial_rotary_factor: f32, factor: f32 },
    /// YaRN (gpt-oss, DeepSeek): frequencies blended between scaled and
    /// original across a ramp of dimensions, and an input scale (mscale).
    Yarn { factor: f32, original_max_position_embeddings: f32, beta_fast: f32, beta_slow: f32, mscale: f32, mscale_all_dim: f32 },
}

/// A number or a list of numbers (Phi-3's factors come either way).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Factors {
    One(f32),
    Many(Vec<f32>),
}

/// `rope_scaling` as config.json spells it.
#[derive(Debug, Clone, Deserialize)]
struct RawRopeScaling {
    #[serde(rename = "type")]
    type_: Option<String>,
    rope_type: Option<String>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<f32>,
    long_factor: Option<Factors>,
    long_mscale: Option<f32>,
    factors: Option<Vec<f32>>,
    beta_fast: Option<f32>,
    beta_slow: Option<f32>,
    mscale: Option<f32>,
    mscale_all_dim: Option<f32>,
    partial_rotary_factor: Option<f32>,
}

impl RopeScaling {
    /// The scaling `raw` (config.json's object) asks for. `rotary_half` is the
    /// number of rotated frequency pairs; `max_positions` the model's
    /// (max_position_embeddings, original_max_position_embeddings), which only
    /// longrope needs.
    fn from_raw(raw: RawRopeScaling, rotary_half: usize, max_positions: Option<(i32, i32)>) -> std::result::Result<RopeScaling, String> {
        let kind = raw.type_.or(raw.rope_type).unwrap_or_else(|| "default".into());
        let factor = || raw.factor.ok_or_else(|| format!("rope_scaling of type {kind} needs a numeric factor"));
        Ok(match kind.as_str() {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear { factor: factor()? },
            "llama3" => RopeScaling::Llama3 {
                factor: factor()?,
                low_freq_factor: raw.low_freq_factor.unwrap_or(1.0),
                high_freq_factor: raw.high_freq_factor.unwrap_or(4.0),
                original_max_position_embeddings: raw.original_max_position_embeddings.unwrap_or(8192.0),
            },
            "su" | "longrope" => {
                let (max_pos, orig) = max_positions.ok_or_else(|| format!("rope_scaling type {kind:?} is not supported by this architecture"))?;
                let long_factor = match raw.long_factor {
                    Some(Factors::Many(v)) => v,
                    Some(Factors::One(x)) => vec![x; rotary_half],
                    None => return Err("rope_scaling must contain long_factor".into()),
                };
                if long_factor.len() != rotary_half {
                    return Err(format!("rope_scaling.long_factor has {} entries, rotary dims/2 is {rotary_half}", long_factor.len()));
                }
                RopeScaling::LongRope { long_factor, long_mscale: raw.long_mscale, max_position_embeddings: max_pos, original_max_position_embeddings: orig }
            }
            "proportional" => RopeScaling::Proportional {
                partial_rotary_factor: raw.partial_rotary_factor.unwrap_or(1.0),
                factor: raw.factor.unwrap_or(1.0),
            },
            "yarn" => RopeScaling::Yarn {
                factor: factor()?,
                // mlx-lm's YarnRoPE defaults.
                original_max_position_embeddings: raw.original_max_position_embeddings.unwrap_or(4096.0),
                beta_fast: raw.beta_fast.unwrap_or(32.0),
                beta_slow: raw.beta_slow.unwrap_or(1.0),
                mscale: raw.mscale.unwrap_or(1.0),
                mscale_all_dim: raw.mscale_all_dim.unwrap_or(0.0),
            },
            "freq_factors" => {
                let factors = raw.factors.ok_or("rope_scaling of type freq_factors needs factors")?;
                if factors.len() != rotary_half {
                    return Err(format!("rope_scaling.factors has {} entries, rotary dims/2 is {rotary_half}", factors.len()));
                }
                RopeScaling::FreqFactors { factors }
            }
            other => return Err(format!("rope_scaling type {other:?} is not supported yet")),
        })
    }

    /// `config[key]` (absent or null: no scaling), typed.
    pub fn read(config: &ConfigFile, key: &str, rotary_half: usize, max_positions: Option<(i32, i32)>) -> Result<RopeScaling> {
        match config.value.get(key) {
            None | Some(Value::Null) => Ok(RopeScaling::Default),
            Some(v) => {
                let raw: RawRopeScaling = serde_json::from_value(v.clone()).map_err(|e| config.error(format!("invalid config: field `{key}`: {e}")))?;
                RopeScaling::from_raw(raw, rotary_half, max_positions).map_err(|m| config.error(m))
            }
        }
    }
}

/// The fields every decoder's config.json shares (Hugging Face names).
/// Architectures differ in defaults, passed to [`DecoderConfig::spec`].
#[derive(Debug, Clone, Deserialize)]
pub struct DecoderConfig {
    pub hidden_size: i32,
    pub num_hidden_layers: i32,
    pub intermediate_size: i32,
    pub num_attention_heads: i32,
    pub num_key_value_heads: Option<i32>,
    pub head_dim: Option<i32>,
    pub rms_norm_eps: f32,
    pub vocab_size: i32,
    pub rope_theta: Option<f32>,
    #[serde(default)]
    pub rope_traditional: bool,
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
}

/// What an architecture assumes where config.json is silent (mlx-lm's defaults).
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    /// None: the field is required.
    pub rope_theta: Option<f32>,
    pub tie_word_embeddings: Option<bool>,
}

impl DecoderConfig {
    pub fn n_kv_heads(&self) -> i32 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> i32 {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// A plain Llama-style decoder of these fields: attention with
    /// `attention_bias` on all four projections, no q/k norm, a dense MLP on
    /// every layer, rope over the whole head from `rope_scaling`.
    /// Architectures change what differs.
    pub fn spec(&self, config: &ConfigFile, defaults: Defaults) -> Result<DecoderSpec> {
        let head_dim = self.head_dim();
        let scaling = RopeScaling::read(config, "rope_scaling", (head_dim / 2) as usize, None)?;
        self.spec_with_rope(config, defaults, head_dim, scaling)
    }

    /// [`Self::spec`] with rope over `rope_dims` features and the given scaling
    /// (architectures that read them differently: partial rotary, `rope_parameters`).
    pub fn spec_with_rope(&self, config: &ConfigFile, defaults: Defaults, rope_dims: i32, scaling: RopeScaling) -> Result<DecoderSpec> {
        let rope_theta = self
            .rope_theta
            .or(defaults.rope_theta)
            .ok_or_else(|| config.error("invalid config: missing field `rope_theta`"))?;
        let tie_word_embeddings = self
            .tie_word_embeddings
            .or(defaults.tie_word_embeddings)
            .ok_or_else(|| config.error("invalid config: missing field `tie_word_embeddings`"))?;
        let head_dim = self.head_dim();
        Ok(DecoderSpec {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_layers: self.num_hidden_layers,
            intermediate_size: self.intermediate_size,
            attention: AttentionSpec {
                n_heads: self.num_attention_heads,
                n_kv_heads: self.n_kv_heads(),
                head_dim,
                qkv_bias: self.attention_bias,
                o_bias: self.attention_bias,
                qk_norm: QkNorm::None,
                scale: None,
                fused_qkv: false,
                sinks: false,
            },
            mlp_bias: self.mlp_bias,
            rms_norm_eps: self.rms_norm_eps,
            rope: RopeSpec { theta: rope_theta, traditional: self.rope_traditional, scaling, dims: rope_dims },
            fused_gate_up: false,
            tie_word_embeddings,
            moe: None,
            moe_layers: Vec::new(),
            windows: Vec::new(),
            sanitize: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn file(v: &Value) -> ConfigFile<'_> {
        ConfigFile { value: v, path: Path::new("m/config.json") }
    }

    #[test]
    fn a_wrongly_typed_field_is_named_with_the_file() {
        let v = json!({"hidden_size": "64"});
        let e = file(&v).parse::<DecoderConfig>().unwrap_err().to_string();
        assert!(e.contains("m/config.json") && e.contains("hidden_size"), "{e}");
    }

    #[test]
    fn rope_scaling_reads_both_spellings_of_the_type() {
        let v = json!({"rope_scaling": {"rope_type": "linear", "factor": 2.0}});
        assert_eq!(RopeScaling::read(&file(&v), "rope_scaling", 8, None).unwrap(), RopeScaling::Linear { factor: 2.0 });
        let v = json!({"rope_scaling": {"type": "llama3", "factor": 8.0}});
        let RopeScaling::Llama3 { high_freq_factor, .. } = RopeScaling::read(&file(&v), "rope_scaling", 8, None).unwrap() else {
            panic!("llama3 expected")
        };
        assert_eq!(high_freq_factor, 4.0);
        let v = json!({"rope_scaling": null});
        assert_eq!(RopeScaling::read(&file(&v), "rope_scaling", 8, None).unwrap(), RopeScaling::Default);
    }

    #[test]
    fn bad_rope_scaling_says_what_is_wrong() {
        let err = |v: Value, max: Option<(i32, i32)>| RopeScaling::read(&file(&v), "rope_scaling", 8, max).unwrap_err().to_string();
        assert!(err(json!({"rope_scaling": {"type": "linear"}}), None).contains("needs a numeric factor"));
        assert!(err(json!({"rope_scaling": {"type": "weird"}}), None).contains("\"weird\" is not supported"));
        assert!(err(json!({"rope_scaling": {"type": "longrope", "long_factor": [1.0]}}), Some((8, 4))).contains("1 entries"));
        assert!(err(json!({"rope_scaling": {"type": "longrope"}}), None).contains("not supported by this architecture"));
        assert!(err(json!({"rope_scaling": {"factor": "x"}}), None).contains("rope_scaling"));
    }
}
