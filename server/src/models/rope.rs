//! Rotary position embeddings: the variants mlx-lm's `initialize_rope` builds,
//! all through `mx.fast.rope` (a base, or precomputed frequencies).

use mlx_rs_safe::{fast, ops, Array, Dtype};

use super::config::RopeScaling;
use super::decoder::RopeSpec;
use crate::error::Result;
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
    /// Phi-3's SuScaledRoPE and YarnRoPE: the rotated features are first
    /// multiplied by `input_scale` (where it is not 1), then rotated with
    /// precomputed frequencies.
    Scaled { freqs: Array, input_scale: f32 },
}

impl Rope {
    /// mlx-lm's `initialize_rope(dims, base, traditional, rope_scaling, max_pos)`
    /// (Phi-3's SuScaledRoPE for longrope).
    pub fn new(spec: &RopeSpec) -> Result<Rope> {
        let (dims, base) = (spec.dims, spec.theta);
        let kind = match &spec.scaling {
            RopeScaling::Default => RopeKind::Base { base, scale: 1.0 },
            RopeScaling::Linear { factor } => RopeKind::Base { base, scale: 1.0 / factor },
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                RopeKind::Freqs(llama3_freqs(dims, base, *factor, *low_freq_factor, *high_freq_factor, *original_max_position_embeddings)?)
            }
            RopeScaling::FreqFactors { factors } => RopeKind::Freqs(scaled_periods(dims, base, factors)?),
            RopeScaling::Proportional { partial_rotary_factor, factor } => {
                RopeKind::Freqs(proportional_freqs(dims, base, *partial_rotary_factor, *factor)?)
            }
            RopeScaling::LongRope { long_factor, long_mscale, max_position_embeddings, original_max_position_embeddings } => {
                let freqs = scaled_periods(dims, base, long_factor)?;
                let factor = *max_position_embeddings as f64 / *original_max_position_embeddings as f64;
                let input_scale = match long_mscale {
                    Some(m) if *m != 0.0 => *m,
                    _ if factor <= 1.0 => 1.0,
                    _ => (1.0 + factor.ln() / (*original_max_position_embeddings as f64).ln()).sqrt() as f32,
                };
                return Ok(Rope { dims, traditional: false, kind: RopeKind::Scaled { freqs, input_scale } });
            }
            RopeScaling::Yarn { factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim } => {
                let (freqs, input_scale) =
                    yarn(dims, base, *factor, *original_max_position_embeddings, *beta_fast, *beta_slow, *mscale, *mscale_all_dim)?;
                RopeKind::Scaled { freqs, input_scale }
            }
        };
        Ok(Rope { dims, traditional: spec.traditional, kind })
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
            RopeKind::Scaled { freqs, input_scale } if *input_scale == 1.0 => rope(x, self.traditional, None, 1.0, Some(freqs))?,
            RopeKind::Scaled { freqs, input_scale } => {
                // x.at[..., :dims].multiply(scale)
                let scale = ops::scalar_as(*input_scale, x.dtype())?;
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
                rope(&scaled, self.traditional, None, 1.0, Some(freqs))?
            }
        })
    }
}

/// mlx-lm's YarnRoPE: (frequencies, input scale), with the same float32 ops
/// for the frequencies and f64 (Python floats) for the scalars.
#[allow(clippy::too_many_arguments)]
fn yarn(dims: i32, base: f32, factor: f32, original: f32, beta_fast: f32, beta_slow: f32, mscale: f32, mscale_all_dim: f32) -> Result<(Array, f32)> {
    let (d, b, orig) = (dims as f64, base as f64, original as f64);
    let correction_dim = |rotations: f64| (d * (orig / (rotations * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * b.ln());
    let low = correction_dim(beta_fast as f64).floor().max(0.0);
    let high = correction_dim(beta_slow as f64).ceil().min(d - 1.0);
    let get_mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
    let input_scale = get_mscale(factor as f64, mscale as f64) / get_mscale(factor as f64, mscale_all_dim as f64);
    let idx = ops::arange(0.0, d, 2.0, Dtype::Float32)?;
    let freq_extra = ops::power(&Array::scalar(base), &ops::divide(&idx, &Array::scalar(dims as f32))?)?;
    let freq_inter = ops::multiply(&Array::scalar(factor), &freq_extra)?;
    // 1 - clip((arange(dims / 2) - low) / (high - low), 0, 1), the span widened where it is empty.
    let span = if low == high { high + 0.001 - low } else { high - low };
    let ramp = ops::divide(
        &ops::subtract(&ops::arange(0.0, (dims / 2) as f64, 1.0, Dtype::Float32)?, &Array::scalar(low as f32))?,
        &Array::scalar(span as f32),
    )?;
    let one = Array::scalar(1.0f32);
    let mask = ops::subtract(&one, &ops::clip(&ramp, Some(&Array::scalar(0.0f32)), Some(&one))?)?;
    let numerator = ops::multiply(&freq_inter, &freq_extra)?;
    let denominator = ops::add(&ops::multiply(&freq_inter, &mask)?, &ops::multiply(&freq_extra, &ops::subtract(&one, &mask)?)?)?;
    Ok((ops::divide(&numerator, &denominator)?, input_scale as f32))
}

/// mlx-lm's ProportionalRoPE frequencies: factor · base^(arange(0, rotated, 2) /
/// dims) for the first `rotated = int(dims · partial)` features, infinity (no
/// rotation) for the rest.
fn proportional_freqs(dims: i32, base: f32, partial: f32, factor: f32) -> Result<Array> {
    let rotated = (dims as f64 * partial as f64) as i32;
    let exponents = ops::divide(&ops::arange(0.0, rotated as f64, 2.0, Dtype::Float32)?, &Array::scalar(dims as f32))?;
    let turning = ops::multiply(&Array::scalar(factor), &ops::power(&Array::scalar(base), &exponents)?)?;
    let still = ops::full(&[(dims - rotated) / 2], &Array::scalar(f32::INFINITY), Dtype::Float32)?;
    Ok(ops::concatenate(&[&turning, &still], 0)?)
}

/// base ** (arange(0, dims, 2, float32) / dims), each × its factor.
fn scaled_periods(dims: i32, base: f32, factors: &[f32]) -> Result<Array> {
    let idx = ops::arange(0.0, dims as f64, 2.0, Dtype::Float32)?;
    let freqs = ops::power(&Array::scalar(base), &ops::divide(&idx, &Array::scalar(dims as f32))?)?;
    Ok(ops::multiply(&Array::from_vec(factors)?, &freqs)?)
}

/// Llama 3.1's frequency smoothing, computed with the same MLX ops (and so the
/// same float results) as mlx-lm's Llama3RoPE.
fn llama3_freqs(dims: i32, base: f32, factor: f32, low_freq_factor: f32, high_freq_factor: f32, old_context_len: f32) -> Result<Array> {
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
