//! The layers every architecture shares: linear (dense or quantized), embedding
//! (dense or quantized, usable as the tied output head) and RMS norm. Each does
//! exactly what its mlx.nn counterpart does, op for op, so outputs match mlx-lm.

use mlx_rs_safe::{fast, ops, quantized, Array};

use super::quant::{QuantConfig, QuantParams};
use super::weights::Weights;
use crate::error::Result;

/// A quantized weight: packed values, per-group scales and biases.
pub struct QuantizedWeight {
    pub weight: Array,
    pub scales: Array,
    pub biases: Array,
    pub params: QuantParams,
}

impl QuantizedWeight {
    /// Takes `{prefix}.scales/.weight/.biases` if the layer is quantized, checking
    /// them against the float shape `[rows, cols]` the config implies.
    fn take(w: &mut Weights, prefix: &str, rows: i32, cols: i32, quant: &QuantConfig) -> Result<Option<QuantizedWeight>> {
        if !w.contains(&format!("{prefix}.scales")) {
            return Ok(None);
        }
        let params = quant.for_layer(prefix)?;
        let packed = cols * params.bits / 32;
        let groups = cols / params.group_size;
        Ok(Some(QuantizedWeight {
            weight: w.take_packed(&format!("{prefix}.weight"), &[rows, packed])?,
            scales: w.take_shaped(&format!("{prefix}.scales"), &[rows, groups])?,
            biases: w.take_shaped(&format!("{prefix}.biases"), &[rows, groups])?,
            params,
        }))
    }

    /// Like `take`, for a stack of `experts` matrices `[experts, rows, cols]`.
    pub fn take_stacked(
        w: &mut Weights,
        prefix: &str,
        experts: i32,
        rows: i32,
        cols: i32,
        quant: &QuantConfig,
    ) -> Result<Option<QuantizedWeight>> {
        if !w.contains(&format!("{prefix}.scales")) {
            return Ok(None);
        }
        let params = quant.for_layer(prefix)?;
        let (packed, groups) = (cols * params.bits / 32, cols / params.group_size);
        Ok(Some(QuantizedWeight {
            weight: w.take_packed(&format!("{prefix}.weight"), &[experts, rows, packed])?,
            scales: w.take_shaped(&format!("{prefix}.scales"), &[experts, rows, groups])?,
            biases: w.take_shaped(&format!("{prefix}.biases"), &[experts, rows, groups])?,
            params,
        }))
    }

    /// x @ W.T with W dequantized on the fly.
    fn matmul_t(&self, x: &Array) -> Result<Array> {
        Ok(quantized::quantized_matmul(
            x,
            &self.weight,
            &self.scales,
            Some(&self.biases),
            true,
            self.params.group_size,
            self.params.bits,
        )?)
    }
}

pub enum Linear {
    Dense { weight: Array, bias: Option<Array> },
    Quantized { q: QuantizedWeight, bias: Option<Array> },
}

impl Linear {
    /// Loads `{prefix}.weight` of a `in_dim → out_dim` layer (+ `.scales`/`.biases`
    /// when quantized, `.bias` when `bias` is set), checking shapes.
    pub fn load(w: &mut Weights, prefix: &str, in_dim: i32, out_dim: i32, bias: bool, quant: &QuantConfig) -> Result<Linear> {
        let b = if bias { Some(w.take_shaped(&format!("{prefix}.bias"), &[out_dim])?) } else { None };
        Ok(match QuantizedWeight::take(w, prefix, out_dim, in_dim, quant)? {
            Some(q) => Linear::Quantized { q, bias: b },
            None => Linear::Dense { weight: w.take_shaped(&format!("{prefix}.weight"), &[out_dim, in_dim])?, bias: b },
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            // nn.Linear: addmm(bias, x, W.T) with a bias, x @ W.T without.
            Linear::Dense { weight, bias } => {
                let wt = ops::transpose(weight)?;
                Ok(match bias {
                    Some(b) => ops::addmm(b, x, &wt, 1.0, 1.0)?,
                    None => ops::matmul(x, &wt)?,
                })
            }
            Linear::Quantized { q, bias } => {
                let y = q.matmul_t(x)?;
                Ok(match bias {
                    Some(b) => ops::add(&y, b)?,
                    None => y,
                })
            }
        }
    }
}

pub enum Embedding {
    Dense(Array),
    Quantized(QuantizedWeight),
}

impl Embedding {
    /// Loads a `[vocab, dim]` table (quantized or not).
    pub fn load(w: &mut Weights, prefix: &str, vocab: i32, dim: i32, quant: &QuantConfig) -> Result<Embedding> {
        Ok(match QuantizedWeight::take(w, prefix, vocab, dim, quant)? {
            Some(q) => Embedding::Quantized(q),
            None => Embedding::Dense(w.take_shaped(&format!("{prefix}.weight"), &[vocab, dim])?),
        })
    }

    /// Rows of the table for `ids`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(table) => Ok(ops::take(table, ids, 0)?),
            Embedding::Quantized(q) => {
                let w = ops::take(&q.weight, ids, 0)?;
                let s = ops::take(&q.scales, ids, 0)?;
                let b = ops::take(&q.biases, ids, 0)?;
                Ok(quantized::dequantize(&w, &s, Some(&b), q.params.group_size, q.params.bits)?)
            }
        }
    }

    /// Logits of `x`: its own output head where the model has one, else the
    /// tied embedding.
    pub fn logits(&self, head: Option<&Linear>, x: &Array) -> Result<Array> {
        match head {
            Some(head) => head.forward(x),
            None => self.as_linear(x),
        }
    }

    /// The tied output head: x @ table.T.
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        match self {
            Embedding::Dense(table) => Ok(ops::matmul(x, &ops::transpose(table)?)?),
            Embedding::Quantized(q) => q.matmul_t(x),
        }
    }
}

pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    pub fn load(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm { weight: w.take_shaped(&format!("{prefix}.weight"), &[dim])?, eps })
    }

    /// Gemma's norm: rms_norm(x, 1 + weight), the sum taken once at load (the
    /// same array mlx-lm computes at every call), or stored so (GGUF files).
    pub fn load_plus_one(w: &mut Weights, prefix: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        let weight = w.take_shaped(&format!("{prefix}.weight"), &[dim])?;
        if w.norms_hold_one() {
            return Ok(RmsNorm { weight, eps });
        }
        let one = ops::astype(&Array::scalar(1.0f32), weight.dtype())?;
        Ok(RmsNorm { weight: ops::add(&one, &weight)?, eps })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}
