//! Rotary position embeddings: the variants mlx-lm's `initialize_rope` builds,
//! all through `mx.fast.rope` (a base, or precomputed frequencies).

use mlx_rs_safe::{fast, ops, Array, Dtype};
use serde_json::Value;

use crate::error::{Error, Result};

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

    /// Rotates `x` ([B, heads, L, head_dim]) for positions offset.. offset+L.
    pub fn forward(&self, x: &Array, offset: i32) -> Result<Array> {
        Ok(match &self.kind {
            RopeKind::Base { base, scale } => {
                fast::rope(x, self.dims, self.traditional, Some(*base), *scale, offset, None)?
            }
            RopeKind::Freqs(freqs) => fast::rope(x, self.dims, self.traditional, None, 1.0, offset, Some(freqs))?,
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
