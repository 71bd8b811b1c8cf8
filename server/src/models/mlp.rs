//! The gated MLP: down(silu(gate(x)) * up(x)).

use mlx_rs_safe::{ops, Array};

use super::layers::Linear;
use super::quant::QuantConfig;
use super::weights::Weights;
use crate::error::Result;

pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

/// mlx-lm's `swiglu(gate, x)`: silu(gate) * x, with silu(g) = g * sigmoid(g).
pub fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    let silu = ops::multiply(gate, &ops::sigmoid(gate)?)?;
    Ok(ops::multiply(&silu, x)?)
}

impl Mlp {
    pub fn load(w: &mut Weights, prefix: &str, dim: i32, hidden: i32, bias: bool, quant: &QuantConfig) -> Result<Mlp> {
        Ok(Mlp {
            gate_proj: Linear::load(w, &format!("{prefix}.gate_proj"), dim, hidden, bias, quant)?,
            up_proj: Linear::load(w, &format!("{prefix}.up_proj"), dim, hidden, bias, quant)?,
            down_proj: Linear::load(w, &format!("{prefix}.down_proj"), hidden, dim, bias, quant)?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let h = swiglu(&self.gate_proj.forward(x)?, &self.up_proj.forward(x)?)?;
        self.down_proj.forward(&h)
    }
}
