//! The MoE "switch" layers: every expert's weights stacked in one tensor
//! [experts, out, in], applied to each token's chosen experts in one batched
//! gather_mm / gather_qmm — never a loop over experts (mlx-lm's SwitchGLU).

use mlx_rs_safe::compile::Compiled;
use mlx_rs_safe::{ops, quantized, Array};

use super::compiled::call_compiled;
use super::layers::QuantizedWeight;
use super::mlp::swiglu;
use super::quant::{QuantConfig, QuantSpec};
use super::quant_kernel;
use super::weights::{Split, Weights};
use crate::error::Result;
use crate::pacer;

/// The experts' gated activation of (gate, up).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GluActivation {
    /// silu(gate) * up (mlx-lm's swiglu).
    Silu,
    /// gpt-oss's clamped variant: the gate clipped from above at `limit`, up
    /// clipped to ±limit, (up + 1) · gate · sigmoid(alpha · gate).
    SwigluOai { alpha: f32, limit: f32 },
    /// gelu_approx(gate) * up (Gemma 4's experts).
    GeluApprox,
}

/// gpt-oss's swiglu_oai(gate, up), op for op (alpha and limit as inputs 2 and 3,
/// so one compiled graph serves every value).
fn swiglu_oai_graph(a: &[Array]) -> mlx_rs_safe::Result<Vec<Array>> {
    let (gate, x, alpha, limit) = (&a[0], &a[1], &a[2], &a[3]);
    let gate = ops::minimum(gate, limit)?;
    let x = ops::clip(x, Some(&ops::negative(limit)?), Some(limit))?;
    let one = ops::scalar_as(1.0f32, x.dtype())?;
    let glu = ops::multiply(&gate, &ops::sigmoid(&ops::multiply(alpha, &gate)?)?)?;
    Ok(vec![ops::multiply(&ops::add(&x, &one)?, &glu)?])
}

thread_local! {
    // As mlx-lm's `@partial(mx.compile, shapeless=True)` swiglu_oai.
    static SWIGLU_OAI: Option<Compiled> = Compiled::new(swiglu_oai_graph, true).ok();
}

impl GluActivation {
    fn apply(self, gate: &Array, up: &Array) -> Result<Array> {
        match self {
            GluActivation::Silu => swiglu(gate, up),
            GluActivation::GeluApprox => super::mlp::geglu(gate, up),
            GluActivation::SwigluOai { alpha, limit } => {
                // Python floats beside an array: scalars of its dtype.
                let alpha = ops::scalar_as(alpha, gate.dtype())?;
                let limit = ops::scalar_as(limit, gate.dtype())?;
                call_compiled(&SWIGLU_OAI, swiglu_oai_graph, &[gate, up, &alpha, &limit])
            }
        }
    }
}

/// How one stacked projection is stored: quantized (with what) or float, and
/// whether each expert adds a bias.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StackLayout {
    pub quant: Option<QuantSpec>,
    pub bias: bool,
}

/// One stacked projection's weights, dense or quantized.
enum SwitchWeight {
    Dense(Array),
    Quantized(QuantizedWeight),
}

/// One stacked projection, with a bias per expert where the model has them.
pub struct SwitchLinear {
    weight: SwitchWeight,
    bias: Option<Array>,
}

impl SwitchLinear {
    /// Every expert's `in_dim → out_dim` projection, or this rank's part of
    /// each (`split`, under tensor parallelism).
    pub fn load(w: &mut Weights, prefix: &str, experts: i32, in_dim: i32, out_dim: i32, split: Split, bias: bool, quant: &QuantConfig) -> Result<SwitchLinear> {
        let weight = match QuantizedWeight::take_stacked(w, prefix, &[experts], out_dim, in_dim, split, quant)? {
            Some(q) => SwitchWeight::Quantized(q),
            None => SwitchWeight::Dense(w.take_split(&format!("{prefix}.weight"), &[experts, out_dim, in_dim], split)?),
        };
        let bias = match bias {
            true => Some(shard_bias(w.take_shaped(&format!("{prefix}.bias"), &[experts, out_dim])?, w.tensor_parallel(), split)?),
            false => None,
        };
        Ok(SwitchLinear { weight, bias })
    }

    /// The stacked weight where it is quantized and no bias follows.
    fn plain_quantized(&self) -> Option<&QuantizedWeight> {
        match (&self.weight, &self.bias) {
            (SwitchWeight::Quantized(q), None) => Some(q),
            _ => None,
        }
    }

    /// x [..., 1, in] through expert `indices` → [..., 1, out]; `dequantize`:
    /// a quantized stack may be dequantized for sorted indices where that pays.
    fn forward(&self, x: &Array, indices: &Array, sorted: bool, dequantize: bool) -> Result<Array> {
        let y = match &self.weight {
            SwitchWeight::Dense(w) => quantized::gather_mm(x, &ops::swapaxes(w, -1, -2)?, None, Some(indices), sorted)?,
            SwitchWeight::Quantized(q) => q.gather_t(x, indices, sorted, dequantize)?,
        };
        Ok(match &self.bias {
            // mlx-lm: x + expand_dims(bias[indices], -2)
            Some(b) => ops::add(&y, &ops::expand_dims(&ops::take(b, indices, 0)?, &[-2])?)?,
            None => y,
        })
    }
}

/// This rank's part of a per-expert bias [experts, out] under tensor
/// parallelism (mlx-lm's shard of gpt-oss): the run of outputs its rows give
/// (`Rows`), or, where its output is a partial sum over the ranks (`Cols`), the
/// bias divided by their number, so that the sum adds it once.
fn shard_bias(bias: Array, group: Option<&mlx_rs_safe::distributed::Group>, split: Split) -> Result<Array> {
    let Some(g) = group else { return Ok(bias) };
    let (rank, ranks) = (g.rank() as i32, g.size() as i32);
    Ok(match split {
        Split::Rows => {
            let s = bias.shape();
            let part = s[1] / ranks;
            ops::slice(&bias, &[0, rank * part], &[s[0], (rank + 1) * part], &[1, 1])?
        }
        Split::Cols => ops::divide(&bias, &ops::astype(&Array::scalar(ranks), bias.dtype())?)?,
        Split::Whole => bias,
    })
}

pub struct SwitchGlu {
    gate_proj: SwitchLinear,
    up_proj: SwitchLinear,
    down_proj: SwitchLinear,
    activation: GluActivation,
    /// Whether a prompt chunk's products may dequantize the stacks
    /// (`prompt_matmul::gather`): a resident layer's. A streamed layer's keep
    /// MLX's gather_qmm: its prefill waits on the disk, and a dequantized
    /// stack (403 MB a projection of the A3B shape at 16 bits) would come out
    /// of the memory bound its expert budget promises.
    dequantize_prompts: bool,
}

impl SwitchGlu {
    /// Under tensor parallelism each rank holds a run of every expert's
    /// hidden columns, and its output is a partial sum (the caller sums it
    /// over the ranks once, after mixing the experts).
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        experts: i32,
        dim: i32,
        hidden: i32,
        bias: bool,
        activation: GluActivation,
        quant: &QuantConfig,
    ) -> Result<SwitchGlu> {
        let p = |n: &str| format!("{prefix}.{n}");
        Ok(SwitchGlu {
            gate_proj: SwitchLinear::load(w, &p("gate_proj"), experts, dim, hidden, Split::Rows, bias, quant)?,
            up_proj: SwitchLinear::load(w, &p("up_proj"), experts, dim, hidden, Split::Rows, bias, quant)?,
            down_proj: SwitchLinear::load(w, &p("down_proj"), experts, hidden, dim, Split::Cols, bias, quant)?,
            activation,
            dequantize_prompts: true,
        })
    }

    /// The layer over expert stacks given as arrays: per projection (gate, up,
    /// down) its weight, then scales and (affine) biases when quantized, then
    /// its per-expert bias when it has one, as `layouts` says.
    pub fn from_stacks(stacks: &[Array], layouts: &[StackLayout; 3], activation: GluActivation) -> Result<SwitchGlu> {
        let mut it = stacks.iter().cloned();
        let mut next = |layout: StackLayout| -> Result<SwitchLinear> {
            let mut take = || it.next().ok_or(crate::error::Error::Internal("fewer expert stacks than projections need"));
            let weight = match layout.quant {
                Some(params) => SwitchWeight::Quantized(QuantizedWeight {
                    weight: take()?,
                    scales: take()?,
                    biases: if params.mode.has_biases() { Some(take()?) } else { None },
                    params,
                }),
                None => SwitchWeight::Dense(take()?),
            };
            let bias = if layout.bias { Some(take()?) } else { None };
            Ok(SwitchLinear { weight, bias })
        };
        Ok(SwitchGlu { gate_proj: next(layouts[0])?, up_proj: next(layouts[1])?, down_proj: next(layouts[2])?, activation, dequantize_prompts: false })
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
        let h = match self.gated(&x, &idx)? {
            Some(h) => h,
            None => {
                let up = self.up_proj.forward(&x, &idx, do_sort, self.dequantize_prompts)?;
                let gate = self.gate_proj.forward(&x, &idx, do_sort, self.dequantize_prompts)?;
                self.activation.apply(&gate, &up)?
            }
        };
        let mut y = self.down_proj.forward(&h, &idx, do_sort, self.dequantize_prompts)?;
        if indices.size() > quant_kernel::MAX_PAIRS as usize {
            // A prompt chunk's rows (more than a decode batch has): the sorted copy, gate,
            // up, their product, the output and its unsorted copy wait on the device.
            pacer::pace((x.nbytes() + 3 * h.nbytes() + 2 * y.nbytes()) as u64, &y)?;
        }
        if let Some(inv) = inv {
            y = ops::unflatten(&ops::take(&y, &inv, 0)?, 0, &indices.shape())?;
        }
        Ok(ops::squeeze(&y, &[-2])?)
    }

    /// silu(gate) * up of the chosen experts in one kernel (CUDA, decode
    /// batches), where both projections are plain quantized stacks; else None.
    fn gated(&self, x: &Array, idx: &Array) -> Result<Option<Array>> {
        match (self.activation, self.gate_proj.plain_quantized(), self.up_proj.plain_quantized()) {
            (GluActivation::Silu, Some(gate), Some(up)) if gate.params == up.params => {
                quant_kernel::swiglu_gather(x, gate.packed(), up.packed(), idx, gate.params)
            }
            _ => Ok(None),
        }
    }
}
