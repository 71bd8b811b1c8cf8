//! The MoE "switch" layers: every expert's weights stacked in one tensor
//! [experts, out, in], applied to each token's chosen experts in one batched
//! gather_mm / gather_qmm — never a loop over experts (mlx-lm's SwitchGLU).

use mlx_rs_safe::{ops, quantized, Array};

use super::layers::QuantizedWeight;
use super::mlp::swiglu;
use super::quant::{QuantConfig, QuantParams};
use super::weights::{Split, Weights};
use crate::error::Result;

/// One stacked projection, dense or quantized.
pub enum SwitchLinear {
    Dense(Array),
    Quantized(QuantizedWeight),
}

impl SwitchLinear {
    /// Every expert's `in_dim → out_dim` projection, or this rank's part of
    /// each (`split`, under tensor parallelism).
    pub fn load(w: &mut Weights, prefix: &str, experts: i32, in_dim: i32, out_dim: i32, split: Split, quant: &QuantConfig) -> Result<SwitchLinear> {
        Ok(match QuantizedWeight::take_stacked(w, prefix, &[experts], out_dim, in_dim, split, quant)? {
            Some(q) => SwitchLinear::Quantized(q),
            None => SwitchLinear::Dense(w.take_split(&format!("{prefix}.weight"), &[experts, out_dim, in_dim], split)?),
        })
    }

    /// x [..., 1, in] through expert `indices` → [..., 1, out].
    fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        Ok(match self {
            SwitchLinear::Dense(w) => quantized::gather_mm(x, &ops::swapaxes(w, -1, -2)?, None, Some(indices), sorted)?,
            SwitchLinear::Quantized(q) => quantized::gather_qmm(
                x,
                &q.weight,
                &q.scales,
                Some(&q.biases),
                None,
                Some(indices),
                true,
                q.params.group_size,
                q.params.bits,
                sorted,
            )?,
        })
    }
}

pub struct SwitchGlu {
    gate_proj: SwitchLinear,
    up_proj: SwitchLinear,
    down_proj: SwitchLinear,
}

impl SwitchGlu {
    /// Under tensor parallelism each rank holds a run of every expert's
    /// hidden columns, and its output is a partial sum (the caller sums it
    /// over the ranks once, after mixing the experts).
    pub fn load(w: &mut Weights, prefix: &str, experts: i32, dim: i32, hidden: i32, quant: &QuantConfig) -> Result<SwitchGlu> {
        let p = |n: &str| format!("{prefix}.{n}");
        Ok(SwitchGlu {
            gate_proj: SwitchLinear::load(w, &p("gate_proj"), experts, dim, hidden, Split::Rows, quant)?,
            up_proj: SwitchLinear::load(w, &p("up_proj"), experts, dim, hidden, Split::Rows, quant)?,
            down_proj: SwitchLinear::load(w, &p("down_proj"), experts, hidden, dim, Split::Cols, quant)?,
        })
    }

    /// The layer over expert stacks given as arrays: per projection (gate, up,
    /// down) its weight, then scales and biases when `quant` gives it params.
    pub fn from_stacks(stacks: &[Array], quant: &[Option<QuantParams>; 3]) -> Result<SwitchGlu> {
        let mut it = stacks.iter().cloned();
        let mut next = |params: Option<QuantParams>| -> Result<SwitchLinear> {
            let mut take = || it.next().ok_or(crate::error::Error::Internal("fewer expert stacks than projections need"));
            Ok(match params {
                Some(params) => SwitchLinear::Quantized(QuantizedWeight { weight: take()?, scales: take()?, biases: take()?, params }),
                None => SwitchLinear::Dense(take()?),
            })
        };
        Ok(SwitchGlu { gate_proj: next(quant[0])?, up_proj: next(quant[1])?, down_proj: next(quant[2])? })
    }

    /// x [B, L, D], indices [B, L, k] → [B, L, k, D]. With many routed rows the
    /// rows are sorted by expert first, so each expert's weights are read once.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = ops::expand_dims(x, &[-2, -3])?;
        let do_sort = indices.size() >= 64;
        let (x, idx, inv) = if do_sort {
            let m = indices.dim(-1)?;
            let flat = ops::flatten(indices, 0, -1)?;
            let order = ops::argsort(&flat, 0)?;
            let inv = ops::argsort(&order, 0)?;
            let rows = ops::floor_divide(&order, &ops::astype(&Array::scalar(m), order.dtype())?)?;
            let xs = ops::take(&ops::flatten(&x, 0, -3)?, &rows, 0)?;
            (xs, ops::take(&flat, &order, 0)?, Some(inv))
        } else {
            (x, indices.clone(), None)
        };
        let up = self.up_proj.forward(&x, &idx, do_sort)?;
        let gate = self.gate_proj.forward(&x, &idx, do_sort)?;
        let mut y = self.down_proj.forward(&swiglu(&gate, &up)?, &idx, do_sort)?;
        if let Some(inv) = inv {
            y = ops::unflatten(&ops::take(&y, &inv, 0)?, 0, &indices.shape())?;
        }
        Ok(ops::squeeze(&y, &[-2])?)
    }
}
