//! Sparse mixture-of-experts feed-forward: a router picks the top-k experts
//! per token, the switch layer runs them in one batched call, and their outputs
//! are mixed by the router scores.

use std::sync::Arc;

use mlx_rs_safe::{ops, Array};

use super::layers::Linear;
use super::quant::QuantConfig;
use super::streamed_switch::{Guesser, StreamedSwitchGlu};
use super::switch::{GluActivation, SwitchGlu};
use super::weights::Weights;
use crate::error::Result;

/// How the router turns gate logits into (experts, scores); each variant is
/// one architecture's exact op sequence (the order of the chosen experts, and so
/// of the weighted sum, follows it; on CUDA the router kernel chooses the same
/// experts and returns them largest first: `router_kernel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Router {
    /// Qwen3-MoE: softmax over all experts, argpartition(gates, -k)[..., -k:].
    SoftmaxTopKLast,
    /// Qwen2-MoE, OLMoE: softmax over all experts, argpartition(-gates, k-1)[..., :k].
    SoftmaxTopKFirst,
    /// Mixtral: argpartition(-logits, k-1)[..., :k], softmax over the chosen logits.
    TopKThenSoftmax,
    /// gpt-oss: argpartition(logits, -k)[..., -k:], softmax over the chosen logits.
    TopKLastThenSoftmax,
}

#[derive(Debug, Clone)]
pub struct MoeSpec {
    pub num_experts: i32,
    pub top_k: i32,
    pub expert_hidden: i32,
    /// Renormalise the chosen experts' scores to sum to one.
    pub norm_topk_prob: bool,
    pub router: Router,
    /// A dense expert every token also goes through, gated by sigmoid (Qwen2-MoE).
    pub shared_expert_hidden: Option<i32>,
    /// Where Hugging Face checkpoints keep per-expert tensors, as
    /// (their projection name, ours): Mixtral's w1/w2/w3 or gate/up/down.
    pub hf_expert_names: [(&'static str, &'static str); 3],
    /// Route a [tokens, dim] view of the input (OLMoE), not [B, L, dim].
    pub flatten_tokens: bool,
    /// The MoE module's name under each layer ("mlp"; Mixtral: "block_sparse_moe").
    pub module: &'static str,
    /// Names and options of the module's parts.
    pub parts: MoeParts,
}

/// The router and experts of a MoE module, as a family names and builds them.
#[derive(Debug, Clone, Copy)]
pub struct MoeParts {
    /// The router's name in the module ("gate"; gpt-oss: "router"), and
    /// whether it adds a bias.
    pub router_name: &'static str,
    pub router_bias: bool,
    /// The stacked experts' name in the module ("switch_mlp"; gpt-oss: "experts").
    pub switch: &'static str,
    /// Each expert projection adds a bias (gpt-oss).
    pub expert_bias: bool,
    pub activation: GluActivation,
}

impl MoeParts {
    /// What most families have: a bias-free `gate`, stacked `switch_mlp`
    /// experts without biases, silu-gated.
    pub const STANDARD: MoeParts =
        MoeParts { router_name: "gate", router_bias: false, switch: "switch_mlp", expert_bias: false, activation: GluActivation::Silu };
}

pub const HF_GLU_NAMES: [(&str, &str); 3] = [("gate_proj", "gate_proj"), ("up_proj", "up_proj"), ("down_proj", "down_proj")];

struct SharedExpert {
    mlp: super::mlp::Mlp,
    gate: Linear,
}

/// The routed experts: all in memory, or streamed from disk.
pub enum Experts {
    Resident(SwitchGlu),
    Streamed(Arc<StreamedSwitchGlu>),
}

impl Experts {
    /// The routed experts of the MoE module at `prefix` (layer `layer`): with
    /// expert streaming on (`Weights::streaming`) indexed for reading on
    /// demand; else in memory, per-expert Hugging Face tensors
    /// (`{prefix}.experts.{e}.{proj}.weight`) first stacked as mlx-lm's
    /// sanitize does.
    pub fn load(w: &mut Weights, prefix: &str, layer: u32, dim: i32, spec: &MoeSpec, quant: &QuantConfig) -> Result<Experts> {
        let parts = spec.parts;
        match w.streaming() {
            Some(_) if w.tensor_parallel().is_some() => {
                Err(crate::error::Error::Config("--stream-experts cannot be combined with tensor parallelism (--distributed tensor)".into()))
            }
            Some(stream) => Ok(Experts::Streamed(StreamedSwitchGlu::load(w, prefix, layer, spec, dim, quant, stream)?)),
            None => {
                stack_experts(w, prefix, spec.num_experts, &spec.hf_expert_names)?;
                let switch = format!("{prefix}.{}", parts.switch);
                Ok(Experts::Resident(SwitchGlu::load(w, &switch, spec.num_experts, dim, spec.expert_hidden, parts.expert_bias, parts.activation, quant)?))
            }
        }
    }

    /// x [B, L, D], indices [B, L, k] → [B, L, k, D].
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        match self {
            Experts::Resident(s) => s.forward(x, indices),
            Experts::Streamed(s) => s.forward(x, indices),
        }
    }

    /// Streamed experts: how the layer before guesses which this layer's
    /// router picks (`--expert-prefetch`). Resident experts need no guess.
    pub fn guess_with(&self, guesser: Guesser) {
        if let Experts::Streamed(s) = self {
            s.guess_with(guesser);
        }
    }
}

pub struct SparseMoe {
    spec: MoeSpec,
    gate: Linear,
    experts: Experts,
    shared: Option<SharedExpert>,
    /// Under tensor parallelism: the routed experts' mixed output is this
    /// rank's partial sum, summed over the group (the router stays whole).
    reduce: Option<mlx_rs_safe::distributed::Group>,
}

impl SparseMoe {
    /// Loads the router `{prefix}.{router_name}`, the routed experts (see
    /// [`Experts::load`]) and the shared expert where the family has one.
    pub fn load(w: &mut Weights, prefix: &str, layer: u32, dim: i32, spec: MoeSpec, quant: &QuantConfig) -> Result<SparseMoe> {
        let reduce = w.tensor_parallel().cloned();
        let experts = Experts::load(w, prefix, layer, dim, &spec, quant)?;
        let shared = match spec.shared_expert_hidden {
            Some(hidden) => Some(SharedExpert {
                mlp: super::mlp::Mlp::load(w, &format!("{prefix}.shared_expert"), dim, hidden, false, quant)?,
                gate: Linear::load(w, &format!("{prefix}.shared_expert_gate"), dim, 1, false, quant)?,
            }),
            None => None,
        };
        let gate = Linear::load(w, &format!("{prefix}.{}", spec.parts.router_name), dim, spec.num_experts, spec.parts.router_bias, quant)?;
        experts.guess_with(Guesser { proj: gate.clone(), norm: None, top_k: spec.top_k });
        Ok(SparseMoe {
            gate,
            experts,
            shared,
            spec,
            reduce,
        })
    }

    /// Routes each token to its top-k experts and mixes their outputs by score.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        if self.spec.flatten_tokens {
            let shape = x.shape();
            let flat = ops::reshape(x, &[-1, shape[shape.len() - 1]])?;
            return Ok(ops::reshape(&self.route(&flat)?, &shape)?);
        }
        self.route(x)
    }

    fn route(&self, x: &Array) -> Result<Array> {
        let (k, norm) = (self.spec.top_k, self.spec.norm_topk_prob);
        let logits = self.gate.forward(x)?;
        let (inds, scores) = match super::router_kernel::route(&logits, self.spec.router, k, norm)? {
            Some(routed) => routed,
            None => route_with_ops(&logits, self.spec.router, k, norm)?,
        };
        let y = self.experts.forward(x, &inds)?;
        let weighted = ops::multiply(&y, &ops::expand_dims(&scores, &[-1])?)?;
        let mut mixed = ops::astype(&ops::sum(&weighted, &[-2], false)?, y.dtype())?;
        if let Some(group) = &self.reduce {
            mixed = group.all_sum(&mixed)?;
        }
        match &self.shared {
            None => Ok(mixed),
            Some(s) => {
                let gate = ops::sigmoid(&s.gate.forward(x)?)?;
                Ok(ops::add(&mixed, &ops::multiply(&gate, &s.mlp.forward(x)?)?)?)
            }
        }
    }
}

/// The experts each row of `logits` [..., E] routes to and their scores, by
/// `router`'s exact op sequence (mlx-lm's), scores divided by their sum when
/// `norm`: the path everywhere but where the router kernel serves
/// (`router_kernel`), and that kernel's reference.
pub fn route_with_ops(logits: &Array, router: Router, k: i32, norm: bool) -> Result<(Array, Array)> {
    let e = logits.dim(-1)?;
    let last = |a: &Array, from: i32, to: i32| ops::slice_axis(a, -1, from, to);
    let (inds, scores) = match router {
        Router::SoftmaxTopKLast => {
            let gates = ops::softmax(logits, &[-1], true)?;
            let inds = last(&ops::argpartition(&gates, -k, -1)?, e - k, e)?;
            let scores = ops::take_along_axis(&gates, &inds, -1)?;
            (inds, scores)
        }
        Router::SoftmaxTopKFirst => {
            let gates = ops::softmax(logits, &[-1], true)?;
            let inds = last(&ops::argpartition(&ops::negative(&gates)?, k - 1, -1)?, 0, k)?;
            let scores = ops::take_along_axis(&gates, &inds, -1)?;
            (inds, scores)
        }
        Router::TopKThenSoftmax => {
            let inds = last(&ops::argpartition(&ops::negative(logits)?, k - 1, -1)?, 0, k)?;
            let scores = ops::softmax(&ops::take_along_axis(logits, &inds, -1)?, &[-1], true)?;
            (inds, scores)
        }
        Router::TopKLastThenSoftmax => {
            let inds = last(&ops::argpartition(logits, -k, -1)?, e - k, e)?;
            let scores = ops::softmax(&ops::take_along_axis(logits, &inds, -1)?, &[-1], true)?;
            (inds, scores)
        }
    };
    if norm {
        return Ok((inds, ops::divide(&scores, &ops::sum(&scores, &[-1], true)?)?));
    }
    Ok((inds, scores))
}

/// Hugging Face's fused expert layout, as mlx-lm's sanitize reads it (Gemma 4,
/// Qwen3.5-MoE): one gate-and-up stack `{prefix}.experts.gate_up_proj`
/// [experts, 2 · hidden, dim] split in halves, and `{prefix}.experts.down_proj`,
/// renamed to `{prefix}.{switch}.{gate,up,down}_proj.weight`. Nothing to do
/// for other layouts.
pub fn split_fused_experts(w: &mut Weights, prefix: &str, switch: &str, experts: i32, hidden: i32, dim: i32) -> Result<()> {
    let fused = format!("{prefix}.experts.gate_up_proj");
    if !w.contains(&fused) {
        return Ok(());
    }
    let gate_up = w.take_shaped(&fused, &[experts, 2 * hidden, dim])?;
    let halves: [_; 2] = ops::split_into(&gate_up, -2)?;
    for (name, half) in ["gate_proj", "up_proj"].into_iter().zip(halves) {
        w.insert(format!("{prefix}.{switch}.{name}.weight"), ops::contiguous(&half, false)?);
    }
    let down = w.take_shaped(&format!("{prefix}.experts.down_proj"), &[experts, dim, hidden])?;
    w.insert(format!("{prefix}.{switch}.down_proj.weight"), down);
    Ok(())
}

/// Replaces per-expert tensors `{prefix}.experts.{e}.{hf}.{weight,scales,biases}`
/// (e < n) by stacked `{prefix}.switch_mlp.{ours}.*`, as mlx-lm's sanitize does.
fn stack_experts(w: &mut Weights, prefix: &str, n: i32, names: &[(&str, &str); 3]) -> Result<()> {
    for (hf, ours) in names {
        for part in ["weight", "scales", "biases"] {
            if !w.contains(&format!("{prefix}.experts.0.{hf}.{part}")) {
                continue;
            }
            let parts = (0..n)
                .map(|e| w.take_unchecked(&format!("{prefix}.experts.{e}.{hf}.{part}")))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Array> = parts.iter().collect();
            w.insert(format!("{prefix}.switch_mlp.{ours}.{part}"), ops::stack(&refs, 0)?);
        }
    }
    Ok(())
}
