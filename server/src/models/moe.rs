//! Sparse mixture-of-experts feed-forward: a router picks the top-k experts
//! per token, the switch layer runs them in one batched call, and their outputs
//! are mixed by the router scores.

use mlx_rs_safe::{ops, Array};

use super::layers::Linear;
use super::quant::QuantConfig;
use super::switch::SwitchGlu;
use super::weights::Weights;
use crate::error::Result;

#[derive(Debug, Clone)]
pub struct MoeSpec {
    pub num_experts: i32,
    pub top_k: i32,
    pub expert_hidden: i32,
    /// Renormalise the chosen experts' scores to sum to one.
    pub norm_topk_prob: bool,
}

pub struct SparseMoe {
    spec: MoeSpec,
    gate: Linear,
    experts: SwitchGlu,
}

impl SparseMoe {
    /// Loads `{prefix}.gate` and `{prefix}.switch_mlp`, first stacking per-expert
    /// Hugging Face tensors (`{prefix}.experts.{e}.{proj}.weight`) as mlx-lm's
    /// sanitize does.
    pub fn load(w: &mut Weights, prefix: &str, dim: i32, spec: MoeSpec, quant: &QuantConfig) -> Result<SparseMoe> {
        stack_experts(w, prefix, spec.num_experts)?;
        Ok(SparseMoe {
            gate: Linear::load(w, &format!("{prefix}.gate"), dim, spec.num_experts, false, quant)?,
            experts: SwitchGlu::load(w, &format!("{prefix}.switch_mlp"), spec.num_experts, dim, spec.expert_hidden, quant)?,
            spec,
        })
    }

    /// Qwen3-MoE routing: softmax over all experts (float32), top-k, optional
    /// renormalisation, weighted sum of the experts' outputs.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gates = ops::softmax(&self.gate.forward(x)?, &[-1], true)?;
        let k = self.spec.top_k;
        let e = self.spec.num_experts;
        let part = ops::argpartition(&gates, -k, -1)?;
        let shape = part.shape();
        let n = shape.len();
        let mut start = vec![0; n];
        start[n - 1] = e - k;
        let inds = ops::slice(&part, &start, &shape, &vec![1; n])?;
        let mut scores = ops::take_along_axis(&gates, &inds, -1)?;
        if self.spec.norm_topk_prob {
            scores = ops::divide(&scores, &ops::sum(&scores, &[-1], true)?)?;
        }
        let y = self.experts.forward(x, &inds)?;
        let weighted = ops::multiply(&y, &ops::expand_dims(&scores, &[-1])?)?;
        Ok(ops::astype(&ops::sum(&weighted, &[-2], false)?, y.dtype())?)
    }
}

/// Replaces `{prefix}.experts.{e}.{proj}.weight` (e < n) by one stacked
/// `{prefix}.switch_mlp.{proj}.weight`.
fn stack_experts(w: &mut Weights, prefix: &str, n: i32) -> Result<()> {
    if !w.contains(&format!("{prefix}.experts.0.up_proj.weight")) {
        return Ok(());
    }
    for proj in ["up_proj", "down_proj", "gate_proj"] {
        let parts = (0..n)
            .map(|e| w.take(&format!("{prefix}.experts.{e}.{proj}.weight")))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Array> = parts.iter().collect();
        w.insert(format!("{prefix}.switch_mlp.{proj}.weight"), ops::stack(&refs, 0)?);
    }
    Ok(())
}
