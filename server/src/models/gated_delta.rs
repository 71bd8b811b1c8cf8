//! The gated delta rule of Gated DeltaNet layers (Qwen3.5, Qwen3-Next): per
//! token t and value head, with the state S [Dv, Dk]
//!   S ← g_t · S;  S ← S + k_t ⊗ β_t (v_t − S k_t);  y_t = S q_t
//! (q, k L2-normalised, q scaled by Dk^-½). On the CPU it runs as mlx-lm's
//! ops path does — one compiled step per token, op for op, so the tokens are
//! mlx-lm's. On a GPU one custom kernel runs the whole sequence with the state
//! in registers (`metal-kernels/gated_delta.{cu,metal}`), where a start-up
//! check found it agreeing with the ops path (mlx-lm runs its own Metal
//! kernel on Apple GPUs, and the ops path on CUDA).

use std::sync::OnceLock;

use mlx_rs_safe::compile::Compiled;
use mlx_rs_safe::kernels::{gpu_backend, CustomKernel, KernelCall, KernelLanguage, KernelSource, TemplateArg};
use mlx_rs_safe::{fast, ops, Array, Dtype};

use super::compiled::call_compiled;
use crate::error::{Error, Result};

/// mlx.nn.silu: x · sigmoid(x).
fn silu_graph(a: &[Array]) -> mlx_rs_safe::Result<Vec<Array>> {
    Ok(vec![ops::multiply(&a[0], &ops::sigmoid(&a[0])?)?])
}

/// mlx-lm's precise_swiglu(h, gate, x): silu(gate) · x in float32, as h's dtype.
fn precise_swiglu_graph(a: &[Array]) -> mlx_rs_safe::Result<Vec<Array>> {
    let gate = ops::astype(&a[1], Dtype::Float32)?;
    let gate = ops::multiply(&gate, &ops::sigmoid(&gate)?)?;
    let x = ops::astype(&a[2], Dtype::Float32)?;
    Ok(vec![ops::astype(&ops::multiply(&gate, &x)?, a[0].dtype())?])
}

/// mlx-lm's compute_g(A_log, a, dt_bias): exp(−exp(A_log) · softplus(a + dt_bias)), float32.
fn decay_graph(x: &[Array]) -> mlx_rs_safe::Result<Vec<Array>> {
    let a_log = ops::astype(&x[0], Dtype::Float32)?;
    let shifted = ops::add(&x[1], &x[2])?;
    let softplus = ops::logaddexp(&shifted, &ops::scalar_as(0.0, shifted.dtype())?)?;
    Ok(vec![ops::exp(&ops::multiply(&ops::negative(&ops::exp(&a_log)?)?, &softplus)?)?])
}

/// One token of the rule for every row and head (mlx-lm's
/// `_gated_delta_step_ops`): q, k [B, H, Dk], v [B, H, Dv], g, beta [B, H],
/// state [B, H, Dv, Dk] → y [B, H, Dv] (q's dtype), the new state.
fn step_graph(x: &[Array]) -> mlx_rs_safe::Result<Vec<Array>> {
    let [q, k, v, g, beta, state] = x else {
        return Err(mlx_rs_safe::Error::InvalidArgument("the gated delta step takes six arrays".into()));
    };
    let state = ops::multiply(state, &ops::expand_dims(g, &[2, 3])?)?;
    let k = ops::expand_dims(k, &[2])?;
    let kv_mem = ops::sum(&ops::multiply(&state, &k)?, &[-1], false)?;
    let delta = ops::multiply(&ops::subtract(v, &kv_mem)?, &ops::expand_dims(beta, &[2])?)?;
    let state = ops::add(&state, &ops::multiply(&k, &ops::expand_dims(&delta, &[3])?)?)?;
    let y = ops::sum(&ops::multiply(&state, &ops::expand_dims(q, &[2])?)?, &[-1], false)?;
    Ok(vec![ops::astype(&y, q.dtype())?, state])
}

thread_local! {
    // As mlx-lm compiles them: the activations and the decay shapeless, the
    // step once per shape.
    static SILU: Option<Compiled> = Compiled::new(silu_graph, true).ok();
    static PRECISE_SWIGLU: Option<Compiled> = Compiled::new(precise_swiglu_graph, true).ok();
    static DECAY: Option<Compiled> = Compiled::new(decay_graph, true).ok();
    static STEP: Option<Compiled> = Compiled::new(step_graph, false).ok();
}

pub fn silu(x: &Array) -> Result<Array> {
    call_compiled(&SILU, silu_graph, &[x])
}

/// Qwen3-Next's gated RMS norm: silu(gate) · rms_norm(h, weight), in float32.
pub fn gated_rms_norm(h: &Array, gate: &Array, weight: &Array, eps: f32) -> Result<Array> {
    let normed = fast::rms_norm(h, Some(weight), eps)?;
    call_compiled(&PRECISE_SWIGLU, precise_swiglu_graph, &[h, gate, &normed])
}

/// L2-normalised q and k (mlx-lm's normalize_qk with eps 1e-6), q scaled by
/// Dk^-½ for the readout: rms_norm with its eps rescaled, times Dk^-1 and Dk^-½.
pub fn normalize_qk(q: &Array, k: &Array) -> Result<(Array, Array)> {
    let dk = q.dim(-1)? as f64;
    let inv_scale = dk.powf(-0.5);
    let eps = (1e-6 * inv_scale * inv_scale) as f32;
    let q = ops::multiply(&ops::scalar_as((inv_scale * inv_scale) as f32, q.dtype())?, &fast::rms_norm(q, None, eps)?)?;
    let k = ops::multiply(&ops::scalar_as(inv_scale as f32, k.dtype())?, &fast::rms_norm(k, None, eps)?)?;
    Ok((q, k))
}

/// The rule over a sequence: q, k [B, T, Hk, Dk], v [B, T, Hv, Dv], the
/// layer's raw gates a, b [B, T, Hv], its A_log and dt_bias [Hv], the state
/// [B, Hv, Dv, Dk] float32 (None: zeros) → y [B, T, Hv, Dv], the new state.
#[allow(clippy::too_many_arguments)]
pub fn update(q: &Array, k: &Array, v: &Array, a: &Array, b: &Array, a_log: &Array, dt_bias: &Array, state: Option<&Array>) -> Result<(Array, Array)> {
    let beta = ops::sigmoid(b)?;
    let g = call_compiled(&DECAY, decay_graph, &[a_log, a, dt_bias])?;
    let (qs, vs) = (q.shape(), v.shape());
    let state = match state {
        Some(s) => s.clone(),
        None => ops::zeros(&[qs[0], vs[2], vs[3], qs[3]], Dtype::Float32)?,
    };
    if kernel_applies(qs[3]) {
        return kernel(q, k, v, &g, &beta, &state);
    }
    ops_path(q, k, v, &g, &beta, state)
}

/// mlx-lm's gated_delta_ops: the heads of q and k repeated to the value
/// heads, then one compiled step per token.
fn ops_path(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, mut state: Array) -> Result<(Array, Array)> {
    let (hk, hv) = (q.dim(2)?, v.dim(2)?);
    let (q, k) = match hv / hk {
        r if r > 1 => (ops::repeat(q, r as usize, -2)?, ops::repeat(k, r as usize, -2)?),
        _ => (q.clone(), k.clone()),
    };
    let at = |a: &Array, t: i32| -> Result<Array> { Ok(ops::squeeze(&ops::slice_axis(a, 1, t, t + 1)?, &[1])?) };
    let steps = q.dim(1)?;
    let mut ys = Vec::with_capacity(steps as usize);
    for t in 0..steps {
        let inputs = [at(&q, t)?, at(&k, t)?, at(v, t)?, at(g, t)?, at(beta, t)?, state];
        let mut out = STEP
            .with(|c| match c {
                Some(c) => c.call(&inputs.iter().collect::<Vec<_>>()),
                None => step_graph(&inputs),
            })?
            .into_iter();
        let (y, s) = out.next().zip(out.next()).ok_or(Error::Internal("the gated delta step returned too few arrays"))?;
        ys.push(y);
        state = s;
    }
    Ok((ops::stack(&ys.iter().collect::<Vec<_>>(), 1)?, state))
}

const CUDA_SOURCE: &str = include_str!("../../../metal-kernels/gated_delta.cu");
const METAL_SOURCE: &str = include_str!("../../../metal-kernels/gated_delta.metal");

/// Threads of a kernel block: four warps, a value row each.
const BLOCK: i32 = 128;

/// Whether the GPU kernel runs this layer's rule: on a GPU whose backend
/// runs custom kernels, for key dims a warp divides, once its start-up check
/// passed. `MLX_SERVE_GDN_KERNEL=0` keeps the ops path (to compare with
/// mlx-lm, which runs the ops path on CUDA).
fn kernel_applies(dk: i32) -> bool {
    dk % 32 == 0 && dk <= 256 && mlx_rs_safe::kernels::current_gpu_backend().is_some() && kernel_usable()
}

fn kernel_usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        let Some(backend) = gpu_backend() else { return false };
        crate::kernel_check::serves(
            "MLX_SERVE_GDN_KERNEL",
            "Gated DeltaNet uses the MLX-ops path",
            &format!("Gated DeltaNet: the {backend} kernel"),
            "the ops path",
            self_check,
        )
    })
}

/// Runs a few random tokens through the kernel and the ops path; None when
/// they agree.
fn self_check() -> Result<Option<String>> {
    use mlx_rs_safe::random;
    let (b, t, hk, hv, dk, dv) = (2, 5, 2, 4, 64, 32);
    let normal = |shape: &[i32], seed: u64| random::normal(shape, Dtype::Float32, 0.0, 1.0, &random::key(seed)?);
    let (q, k) = normalize_qk(&normal(&[b, t, hk, dk], 1)?, &normal(&[b, t, hk, dk], 2)?)?;
    let v = normal(&[b, t, hv, dv], 3)?;
    let g = ops::sigmoid(&normal(&[b, t, hv], 4)?)?;
    let beta = ops::sigmoid(&normal(&[b, t, hv], 5)?)?;
    let state = normal(&[b, hv, dv, dk], 6)?;
    let (y, s) = kernel(&q, &k, &v, &g, &beta, &state)?;
    let (y_ref, s_ref) = ops_path(&q, &k, &v, &g, &beta, state)?;
    let max_diff = |a: &Array, b: &Array| -> Result<f32> {
        Ok(ops::max_all(&ops::abs(&ops::subtract(a, b)?)?, false)?.item::<f32>()?)
    };
    let diff = max_diff(&y, &y_ref)?.max(max_diff(&s, &s_ref)?);
    Ok((diff > 1e-3 || !diff.is_finite()).then(|| format!("max difference {diff}")))
}

thread_local! {
    static KERNEL: Option<CustomKernel> = make_kernel().map_err(|e| log::warn!("Gated DeltaNet kernel: {e}")).ok();
}

fn make_kernel() -> Result<CustomKernel> {
    let (lang, source) = match gpu_backend() {
        Some("cuda") => (KernelLanguage::Cuda, CUDA_SOURCE),
        Some("metal") => (KernelLanguage::Metal, METAL_SOURCE),
        _ => return Err(Error::Internal("no GPU backend for the Gated DeltaNet kernel")),
    };
    let names = ["q", "k", "v", "g", "beta", "state_in"];
    Ok(CustomKernel::new(lang, &KernelSource::new("gated_delta", &names, &["y", "state_out"], source))?)
}

/// The rule by the GPU kernel: a warp per (row, value head, value feature),
/// each lane holding its share of the state row in registers for all T tokens
/// (on CUDA the share MLX's row reduction sums, with mlx-lm's ops' roundings:
/// `metal-kernels/gated_delta.cu`).
fn kernel(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Result<(Array, Array)> {
    let (qs, vs) = (q.shape(), v.shape());
    let (b, t, hk, dk, hv, dv) = (qs[0], qs[1], qs[2], qs[3], vs[2], vs[3]);
    let ints = [("Dk", dk), ("Dv", dv), ("Hk", hk), ("Hv", hv)];
    let mut template = vec![("InT".to_string(), TemplateArg::Dtype(q.dtype()))];
    template.extend(ints.iter().map(|(n, v)| (n.to_string(), TemplateArg::Int(*v))));
    let warps = b * hv * dv;
    let call = KernelCall {
        outputs: vec![(vec![b, t, hv, dv], q.dtype()), (state.shape(), Dtype::Float32)],
        grid: ((warps + BLOCK / 32 - 1) / (BLOCK / 32) * BLOCK, 1, 1),
        thread_group: (BLOCK, 1, 1),
        template,
        ..Default::default()
    };
    let contiguous = |a: &Array| ops::contiguous(a, false);
    let inputs = [
        contiguous(q)?,
        contiguous(&ops::astype(k, q.dtype())?)?,
        contiguous(&ops::astype(v, q.dtype())?)?,
        contiguous(&ops::astype(g, Dtype::Float32)?)?,
        contiguous(&ops::astype(beta, q.dtype())?)?,
        contiguous(&ops::astype(state, Dtype::Float32)?)?,
    ];
    let mut out = KERNEL
        .with(|kern| match kern {
            Some(kern) => Ok(kern.apply(&inputs.iter().collect::<Vec<_>>(), &call)?),
            None => Err(Error::Internal("the Gated DeltaNet kernel did not compile")),
        })?
        .into_iter();
    out.next().zip(out.next()).ok_or(Error::Internal("the Gated DeltaNet kernel returned too few arrays"))
}
