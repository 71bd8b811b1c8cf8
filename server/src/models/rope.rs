//! Rotary position embeddings: the variants mlx-lm's `initialize_rope` builds,
//! all through `mx.fast.rope` (a base, or precomputed frequencies).

use mlx_rs_safe::{fast, ops, Array, Dtype};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::kv::Positions;

pub struct Rope {
    dims: i32,
    traditional: bool,
    kind: RopeKind,
}

enum RopeKind {
    /// nn.RoPE: base and position scale (`linear` scaling is scale = 1/factor).
    Base { base: f32, scale: f32 },
    /// Llama3RoPE and friends: frequencies computed at load.
    Freqs(Array),
    /// Phi-3's SuScaledRoPE: the rotated features are first multiplied by
    /// `input_scale`, then rotated with the long-factor frequencies.
    SuScaled { freqs: Array, input_scale: f32 },
}

impl Rope {
    /// mlx-lm's `initialize_rope(dims, base, traditional, rope_scaling, max_pos)`.
    pub fn new(dims: i32, base: f32, traditional: bool, scaling: Option<&Value>) -> Result<Rope> {
        let rope_type = scaling
            .and_then(|s| s.get("type").or_else(|| s.get("rope_type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let factor = || -> Result<f32> {
            scaling
                .and_then(|s| s.get("factor"))
                .and_then(Value::as_f64)
                .map(|f| f as f32)
                .ok_or_else(|| config_error(&format!("rope_scaling of type {rope_type} needs a numeric factor")))
        };
        let kind = match rope_type {
            "default" => RopeKind::Base { base, scale: 1.0 },
            "linear" => RopeKind::Base { base, scale: 1.0 / factor()? },
            "llama3" => RopeKind::Freqs(llama3_freqs(dims, base, factor()?, scaling.unwrap_or(&Value::Null))?),
            other => return Err(config_error(&format!("rope_scaling type {other:?} is not supported yet"))),
        };
        Ok(Rope { dims, traditional, kind })
    }

    /// Phi-3's `SuScaledRoPE(dims, base, max_position_embeddings,
    /// original_max_position_embeddings, short_factor, long_factor)`.
    pub fn su_scaled(dims: i32, base: f32, max_pos: i32, original_max_pos: i32, scaling: &Value) -> Result<Rope> {
        let factors = |key: &str| -> Result<Vec<f32>> {
            match scaling.get(key) {
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_f64().map(|x| x as f32))
                    .collect::<Option<Vec<f32>>>()
                    .ok_or_else(|| config_error(&format!("rope_scaling.{key} must be numbers"))),
                Some(v) => v
                    .as_f64()
                    .map(|x| vec![x as f32; (dims / 2) as usize])
                    .ok_or_else(|| config_error(&format!("rope_scaling.{key} must be numbers"))),
                None => Ok(vec![1.0; (dims / 2) as usize]),
            }
        };
        let long = factors("long_factor")?;
        if long.len() != (dims / 2) as usize {
            return Err(config_error(&format!(
                "rope_scaling.long_factor has {} entries, rotary dims/2 is {}",
                long.len(),
                dims / 2
            )));
        }
        // base ** (arange(0, dims, 2, float32) / dims), then × long_factor.
        let idx = ops::arange(0.0, dims as f64, 2.0, Dtype::Float32)?;
        let freqs = ops::power(&Array::scalar(base), &ops::divide(&idx, &Array::scalar(dims as f32))?)?;
        let freqs = ops::multiply(&Array::from_vec(&long)?, &freqs)?;
        let factor = max_pos as f64 / original_max_pos as f64;
        let input_scale = match scaling.get("long_mscale").and_then(Value::as_f64) {
            Some(m) if m != 0.0 => m as f32,
            _ if factor <= 1.0 => 1.0,
            _ => (1.0 + factor.ln() / (original_max_pos as f64).ln()).sqrt() as f32,
        };
        Ok(Rope { dims, traditional: false, kind: RopeKind::SuScaled { freqs, input_scale } })
    }

    /// Rotates `x` ([B, heads, L, head_dim]) for positions start.. start+L
    /// (one start for all rows, or one per row).
    pub fn forward(&self, x: &Array, positions: &Positions) -> Result<Array> {
        let rope = |x: &Array, traditional: bool, base: Option<f32>, scale: f32, freqs: Option<&Array>| -> Result<Array> {
            Ok(match positions {
                Positions::Scalar(offset) => fast::rope(x, self.dims, traditional, base, scale, *offset, freqs)?,
                Positions::PerRow(starts) => fast::rope_dynamic(x, self.dims, traditional, base, scale, starts, freqs)?,
            })
        };
        Ok(match &self.kind {
            RopeKind::Base { base, scale } => rope(x, self.traditional, Some(*base), *scale, None)?,
            RopeKind::Freqs(freqs) => rope(x, self.traditional, None, 1.0, Some(freqs))?,
            RopeKind::SuScaled { freqs, input_scale } => {
                // x.at[..., :dims].multiply(scale)
                let scale = ops::astype(&Array::scalar(*input_scale), x.dtype())?;
                let shape = x.shape();
                let n = shape.len();
                let scaled = if shape[n - 1] == self.dims {
                    ops::multiply(x, &scale)?
                } else {
                    let mut stop = shape.clone();
                    stop[n - 1] = self.dims;
                    let part = ops::slice(x, &vec![0; n], &stop, &vec![1; n])?;
                    ops::slice_update(x, &ops::multiply(&part, &scale)?, &vec![0; n], &stop, &vec![1; n])?
                };
                rope(&scaled, false, None, 1.0, Some(freqs))?
            }
        })
    }
}

/// Llama 3.1's frequency smoothing, computed with the same MLX ops (and so the
/// same float results) as mlx-lm's Llama3RoPE.
fn llama3_freqs(dims: i32, base: f32, factor: f32, cfg: &Value) -> Result<Array> {
    let get = |k: &str, d: f32| cfg.get(k).and_then(Value::as_f64).map(|v| v as f32).unwrap_or(d);
    let low_freq_factor = get("low_freq_factor", 1.0);
    let high_freq_factor = get("high_freq_factor", 4.0);
    let old_context_len = get("original_max_position_embeddings", 8192.0);
    let low_freq_wavelen = old_context_len / low_freq_factor;
    let high_freq_wavelen = old_context_len / high_freq_factor;

    let s = |v: f32| Array::scalar(v);
    // base ** (arange(0, dims, 2) / dims)
    let idx = ops::arange(0.0, dims as f64, 2.0, Dtype::Int32)?;
    let exps = ops::divide(&idx, &Array::scalar(dims))?;
    let freqs = ops::power(&s(base), &exps)?;
    let wavelens = ops::multiply(&s(2.0 * std::f32::consts::PI), &freqs)?;
    let freqs = ops::where_(
        &ops::greater(&wavelens, &s(low_freq_wavelen))?,
        &ops::multiply(&freqs, &s(factor))?,
        &freqs,
    )?;
    let is_medium = ops::logical_and(
        &ops::greater(&wavelens, &s(high_freq_wavelen))?,
        &ops::less(&wavelens, &s(low_freq_wavelen))?,
    )?;
    let smooth = ops::divide(
        &ops::subtract(&ops::divide(&s(old_context_len), &wavelens)?, &s(low_freq_factor))?,
        &s(high_freq_factor - low_freq_factor),
    )?;
    // freqs / ((1 - smooth) / factor + smooth)
    let denom = ops::add(&ops::divide(&ops::subtract(&s(1.0), &smooth)?, &s(factor))?, &smooth)?;
    let smooth_freqs = ops::divide(&freqs, &denom)?;
    Ok(ops::where_(&is_medium, &smooth_freqs, &freqs)?)
}

fn config_error(message: &str) -> Error {
    Error::ModelFile { file: "config.json".into(), message: message.to_string() }
}
