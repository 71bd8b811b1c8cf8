//! The gated MLP: down(silu(gate(x)) * up(x)).

use mlx_rs_safe::compile::Compiled;
use mlx_rs_safe::{ops, Array};

use super::compiled::call_compiled;
use super::layers::{Linear, QuantizedWeight, RmsNorm};
use super::quant::QuantConfig;
use super::quant_kernel;
use super::weights::{Split, Weights};
use crate::error::Result;

pub struct Mlp {
    proj: GateUp,
    down_proj: Linear,
    activation: Activation,
    /// The gate and up weights for the gated decode kernel (silu only):
    /// views of a stacked or fused projection's halves, or the separate
    /// layers' own weights.
    gated: Option<(QuantizedWeight, QuantizedWeight)>,
}

/// Gate and up projections: separate, or one fused matmul split in halves
/// (Phi-3's `gate_up_proj`, or gate/up stacked at load).
enum GateUp {
    Separate { gate: Linear, up: Linear },
    Fused(Linear),
}

/// The gate's nonlinearity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) * up (Llama, Qwen, Mistral).
    Silu,
    /// gelu_approx(gate) * up (Gemma).
    GeluApprox,
}

/// A scalar of `x`'s dtype, as MLX treats a Python scalar next to an array.
fn s(v: f32, x: &Array) -> Result<Array> {
    Ok(ops::scalar_as(v, x.dtype())?)
}

/// mlx.nn.gelu_approx: 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))), in
/// the same op order.
pub fn gelu_approx(x: &Array) -> Result<Array> {
    let cube = ops::power(x, &ops::astype(&Array::scalar(3i32), x.dtype())?)?;
    let inner = ops::add(x, &ops::multiply(&s(0.044715, x)?, &cube)?)?;
    let t = ops::tanh(&ops::multiply(&s((2.0f64 / std::f64::consts::PI).sqrt() as f32, x)?, &inner)?)?;
    let half_x = ops::multiply(&s(0.5, x)?, x)?;
    Ok(ops::multiply(&half_x, &ops::add(&s(1.0, x)?, &t)?)?)
}

/// silu(gate) * x, with silu(g) = g * sigmoid(g): the body of mlx-lm's swiglu.
fn swiglu_graph(a: &[Array]) -> mlx_rs_safe::Result<Vec<Array>> {
    let silu = ops::multiply(&a[0], &ops::sigmoid(&a[0])?)?;
    Ok(vec![ops::multiply(&silu, &a[1])?])
}

/// gelu_approx(gate) * x.
fn gelu_glu_graph(a: &[Array]) -> mlx_rs_safe::Result<Vec<Array>> {
    Ok(vec![ops::multiply(&gelu_approx(&a[0]).map_err(to_mlx)?, &a[1])?])
}

fn to_mlx(e: crate::error::Error) -> mlx_rs_safe::Error {
    match e {
        crate::error::Error::Mlx(m) => m,
        other => mlx_rs_safe::Error::InvalidArgument(other.to_string()),
    }
}

fn gelu_graph(a: &[Array]) -> mlx_rs_safe::Result<Vec<Array>> {
    Ok(vec![gelu_approx(&a[0]).map_err(to_mlx)?])
}

thread_local! {
    // Compiled once per thread (the engine thread), shapeless, like mlx-lm's
    // `@partial(mx.compile, shapeless=True)` activations: MLX fuses the
    // elementwise ops into one kernel.
    static SWIGLU: Option<Compiled> = Compiled::new(swiglu_graph, true).ok();
    static GELU_GLU: Option<Compiled> = Compiled::new(gelu_glu_graph, true).ok();
    // mlx.nn.gelu_approx is itself compiled so.
    static GELU: Option<Compiled> = Compiled::new(gelu_graph, true).ok();
}

/// mlx.nn.gelu_approx(x), compiled as MLX compiles it.
pub fn gelu_approx_compiled(x: &Array) -> Result<Array> {
    call_compiled(&GELU, gelu_graph, &[x])
}

/// mlx-lm's `geglu(gate, x)`: gelu_approx(gate) * x, compiled.
pub fn geglu(gate: &Array, x: &Array) -> Result<Array> {
    call_compiled(&GELU_GLU, gelu_glu_graph, &[gate, x])
}

/// mlx-lm's `swiglu(gate, x)`: silu(gate) * x, compiled.
pub fn swiglu(gate: &Array, x: &Array) -> Result<Array> {
    call_compiled(&SWIGLU, swiglu_graph, &[gate, x])
}

impl Mlp {
    pub fn load(w: &mut Weights, prefix: &str, dim: i32, hidden: i32, bias: bool, quant: &QuantConfig) -> Result<Mlp> {
        Mlp::load_with(w, prefix, dim, hidden, bias, Activation::Silu, quant)
    }

    /// Phi-3's MLP: one `gate_up_proj` [2·hidden, dim], split in halves.
    pub fn load_fused(w: &mut Weights, prefix: &str, dim: i32, hidden: i32, quant: &QuantConfig) -> Result<Mlp> {
        if let Some(g) = w.tensor_parallel() {
            return Err(crate::error::Error::Config(format!(
                "tensor parallelism over {} ranks: this model's fused gate_up projection is not split (Phi-3); use --distributed pipeline",
                g.size()
            )));
        }
        let proj = GateUp::Fused(Linear::load(w, &format!("{prefix}.gate_up_proj"), dim, 2 * hidden, false, quant)?);
        Mlp::new(proj, Linear::load(w, &format!("{prefix}.down_proj"), hidden, dim, false, quant)?, Activation::Silu)
    }

    pub fn load_with(
        w: &mut Weights,
        prefix: &str,
        dim: i32,
        hidden: i32,
        bias: bool,
        activation: Activation,
        quant: &QuantConfig,
    ) -> Result<Mlp> {
        // Under tensor parallelism, a run of the hidden columns each.
        let gate = Linear::load_split(w, &format!("{prefix}.gate_proj"), dim, hidden, bias, Split::Rows, quant)?;
        let up = Linear::load_split(w, &format!("{prefix}.up_proj"), dim, hidden, bias, Split::Rows, quant)?;
        // One matmul for both where their weights stack: fewer kernels a step.
        let proj = match Linear::stack_rows(&[&gate, &up])? {
            Some(gate_up) => GateUp::Fused(gate_up),
            None => GateUp::Separate { gate, up },
        };
        Mlp::new(proj, Linear::load_split(w, &format!("{prefix}.down_proj"), hidden, dim, bias, Split::Cols, quant)?, activation)
    }

    fn new(proj: GateUp, down_proj: Linear, activation: Activation) -> Result<Mlp> {
        let gated = match (&proj, activation) {
            (GateUp::Fused(gu), Activation::Silu) => gu.quantized_halves()?,
            (GateUp::Separate { gate, up }, Activation::Silu) => gate.plain_quantized().cloned().zip(up.plain_quantized().cloned()),
            (_, Activation::GeluApprox) => None,
        };
        Ok(Mlp { proj, down_proj, activation, gated })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.down_proj.forward(&self.hidden(x, None)?)
    }

    /// `h + forward(norm.forward(h))`: a layer's output from its residual
    /// stream `h` and the norm before its MLP, the norm applied and the sum
    /// added by the products' kernels where they apply.
    pub fn forward_normed_add(&self, h: &Array, norm: &RmsNorm) -> Result<Array> {
        self.down_proj.forward_add(&self.hidden(h, Some(norm))?, h)
    }

    /// The gated activation act(gate(x)) * up(x), the down projection's
    /// input; with `norm`, of norm.forward(x).
    fn hidden(&self, x: &Array, norm: Option<&RmsNorm>) -> Result<Array> {
        // Norm, gate, up and swiglu in one kernel where it applies (CUDA, decode rows).
        if let Some((gate, up)) = &self.gated {
            if let Some(h) = quant_kernel::swiglu_matmul(x, norm.map(RmsNorm::kernel_norm), gate.packed(), up.packed(), gate.params)? {
                return Ok(h);
            }
        }
        let normed = norm.map(|n| n.forward(x)).transpose()?;
        let x = normed.as_ref().unwrap_or(x);
        let (gate, up) = match &self.proj {
            GateUp::Separate { gate, up } => (gate.forward(x)?, up.forward(x)?),
            GateUp::Fused(gu) => {
                let [g, u] = ops::split_into(&gu.forward(x)?, -1)?;
                (g, u)
            }
        };
        match self.activation {
            Activation::Silu => swiglu(&gate, &up),
            Activation::GeluApprox => geglu(&gate, &up),
        }
    }
}
