//! Affine-quantized matmul for decode-sized batches on NVIDIA GPUs: a
//! tensor-core CUDA kernel (`metal-kernels/quant_matmul.cu`) for x @ Wᵀ with
//! up to 32 rows of x, dense or gathered per MoE expert. MLX 0.32's own CUDA
//! kernels for these shapes read the weights at about an eighth of the card's
//! bandwidth; decoding is nothing but reading the weights, so this is where a
//! decode step's time goes.
//!
//! The kernel runs where it fits and pays (CUDA, the current device the GPU,
//! 4- or 8-bit affine weights with group size 32, 64 or 128 and biases,
//! bfloat16 or float16 activations in the scales' dtype; dense products of
//! [`MIN_ROWS`] to [`MAX_ROWS`] rows, gathered ones of up to [`MAX_PAIRS`]
//! pairs) once its start-up check against MLX's dequantize-then-matmul
//! passed; every other case returns None and the caller runs MLX's op.
//! `MLX_SERVE_QMM_KERNEL=0` turns it off (to compare with MLX's kernels).
//!
//! The gated form ([`swiglu_matmul`], [`swiglu_gather`]) computes an MLP's
//! or an expert's gate and up projections in one launch and applies
//! silu(gate) * up to the two before writing: one kernel where there were
//! three (gate, up, MLX's compiled swiglu; two with gate and up stacked), and
//! a decode step on CUDA is bound by the host's cost per kernel. The residual
//! form ([`matmul_add`]) adds the layer's residual stream to the product as
//! it writes it (`h + o_proj(...)`, `h + down_proj(...)`): one kernel where
//! there were two. `MLX_SERVE_QMM_FUSED=0` turns both forms off (the separate
//! calls, to compare; [`set_fused`] switches them within a process).
//! Metal keeps MLX's kernels, which are tuned for Apple GPUs.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use mlx_rs_safe::kernels::{gpu_backend, CustomKernel, KernelCall, KernelSource, TemplateArg};
use mlx_rs_safe::{ops, quantized, Array, Dtype};

use super::quant::{QuantMode, QuantSpec};
use crate::error::{Error, Result};

const SOURCE: &str = include_str!("../../../metal-kernels/quant_matmul.cu");
const HEADER: &str = include_str!("../../../metal-kernels/quant_matmul.cuh");

/// The most rows of x the kernel takes (8 per tensor-core tile, 4 tiles).
pub const MAX_ROWS: i32 = 32;
/// The most (row, expert) pairs of a gathered call: a decode batch of 64
/// sequences routing to 8 experts each.
pub const MAX_PAIRS: i32 = 512;
/// The fewest rows of x a dense product takes the kernel from: one, so a
/// lone sequence's decode step reads its weights with it too. Decoding one
/// sequence on MLX's CUDA backend is bound by the host (building and
/// launching a step's graph), and a call of our kernel costs more host time
/// than MLX's matvec: while MLX rebuilt a custom kernel's whole source text
/// at each call (~12 us a call, H100) one row kept MLX's kernel. With the
/// source included from files (`mlx_rs_safe::kernels`) a call costs ~6 us
/// against MLX's ~1 us, and the step's GPU time falls more than its host
/// time rises: on an H200, Llama-3.1-8B 4-bit through `mlx-serve generate`
/// decodes one sequence at 224 tok/s against 163 with MLX's matvec (4K
/// prompt; BENCHMARKS.md, "One row on the quantized-matmul kernel").
/// Gathered (MoE) products take it at every row count: MLX's gather_qmm is
/// slower than ours there even counting the launch (the kernel table).
/// `MLX_SERVE_QMM_MIN_ROWS` overrides it (kernel development on a GPU
/// machine: `benches/decode_step.rs` with MLX's matvec at one row is
/// `MLX_SERVE_QMM_MIN_ROWS=2`).
pub const MIN_ROWS: i64 = 1;

/// [`MIN_ROWS`], or the override (read once a process).
fn min_rows() -> i64 {
    static ROWS: OnceLock<i64> = OnceLock::new();
    *ROWS.get_or_init(|| crate::kernel_check::tuned("MLX_SERVE_QMM_MIN_ROWS", MIN_ROWS))
}

/// Warps the grid aims for (an H100 holds 64 per SM, 132 SMs): enough loads
/// in flight to cover the memory latency. `MLX_SERVE_QMM_TARGET_WARPS`
/// overrides it (kernel development on a GPU machine: a step's kernels timed
/// under Nsight Compute at other splits of the reduction).
const TARGET_WARPS: i32 = 4096;

/// The fewest warps a dense product's block takes, as far as its k-blocks
/// go (each warp keeps at least one: [`Tiles::choose_for`]).
const DENSE_MIN_WK: i32 = 4;

/// [`TARGET_WARPS`], or the override (read once a process).
fn target_warps() -> i32 {
    static WARPS: OnceLock<i32> = OnceLock::new();
    *WARPS.get_or_init(|| crate::kernel_check::tuned("MLX_SERVE_QMM_TARGET_WARPS", TARGET_WARPS))
}

/// How a call is cut up: RT tiles of 16 output features per warp (of each
/// projection, gated), MT tiles of 8 rows of x, WK warps of a block
/// splitting the reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiles {
    pub rt: i32,
    pub mt: i32,
    pub wk: i32,
}

impl Tiles {
    /// The tiling for `rows` of x (per pair when gathered), `n` output
    /// features, `k` inputs, `pairs` gathered pairs (1 when dense).
    pub fn choose(rows: i32, n: i32, k: i32, bits: i32, pairs: i32) -> Tiles {
        Tiles::choose_for(rows, n, k, bits, pairs, false)
    }

    /// [`Tiles::choose`] for the gated form (`gated`), whose warps hold two
    /// projections' accumulators: one feature tile of each.
    pub fn choose_for(rows: i32, n: i32, k: i32, bits: i32, pairs: i32, gated: bool) -> Tiles {
        let mt = match (rows + 7) / 8 {
            0 | 1 => 1,
            2 => 2,
            _ => 4,
        };
        // Two feature tiles per warp share each load of x when there are many rows.
        let rt = if mt > 1 && !gated { 2 } else { 1 };
        let blocks = (n + 16 * rt - 1) / (16 * rt) * pairs;
        let k_blocks = (k + 4 * (128 / bits) - 1) / (4 * (128 / bits));
        // A dense product's grid takes at least DENSE_MIN_WK warps a block even when
        // its blocks alone reach the target: an SM holds at most 32 blocks, and the
        // vocabulary's head (8016 blocks at one row) then leaves it short of warps
        // (H200, Nsight Compute: 128256 x 4096 at one row 127.8 us with one warp a
        // block, 114.2 with two, 110.5 with four, 118.2 with eight). Gathered calls
        // keep the target alone: their many-pair grids are unmeasured at other splits.
        let least = if pairs == 1 { DENSE_MIN_WK } else { 1 };
        let target = target_warps();
        let mut wk = 1;
        while wk < Tiles::max_wk(rt, mt, gated) && wk * 2 <= k_blocks && (blocks * wk < target || wk < least) {
            wk *= 2;
        }
        Tiles { rt, mt, wk }
    }

    /// The most warps a block of this tiling may have: the split-K sums
    /// (WK - 1 warps' accumulators) must fit 48 KB of shared memory, and the
    /// block's registers (~140 a thread at 2 x 4 tiles of accumulators) the
    /// SM's 64K.
    fn max_wk(rt: i32, mt: i32, gated: bool) -> i32 {
        if rt * mt * (1 + gated as i32) >= 8 {
            8
        } else {
            16
        }
    }

    fn check(self, gated: bool) -> Result<Tiles> {
        let ok = matches!(self.rt, 1 | 2)
            && !(gated && self.rt > 1)
            && matches!(self.mt, 1 | 2 | 4)
            && matches!(self.wk, 1 | 2 | 4 | 8 | 16)
            && self.wk <= Tiles::max_wk(self.rt, self.mt, gated);
        ok.then_some(self)
            .ok_or_else(|| Error::Config(format!("no quantized-matmul kernel tiling {self:?}{}", if gated { " (gated)" } else { "" })))
    }
}

/// An RMS norm the kernel applies to x before its product: mlx's
/// `rms_norm(x, weight, eps)`.
#[derive(Clone, Copy)]
pub struct Norm<'a> {
    pub weight: &'a Array,
    pub eps: f32,
}

impl Norm<'_> {
    /// Whether it normalizes x's rows: a weight per column, in x's dtype.
    fn fits(self, x: &Array) -> bool {
        self.weight.dtype() == x.dtype() && self.weight.shape() == [x.dim(-1).unwrap_or(-1)]
    }
}

/// One affine-quantized weight as the kernel reads it: packed values,
/// scales, biases.
#[derive(Clone, Copy)]
pub struct Packed<'a> {
    pub w: &'a Array,
    pub scales: &'a Array,
    pub biases: Option<&'a Array>,
}

/// Why the kernel cannot take these weights, or None when it can.
fn unsupported(x: &Array, k: i32, scales: &Array, biases: Option<&Array>, spec: QuantSpec) -> Option<&'static str> {
    if spec.mode != QuantMode::Affine || biases.is_none() {
        Some("not affine")
    } else if !matches!(spec.bits, 4 | 8) || !matches!(spec.group_size, 32 | 64 | 128) {
        Some("bits or group size")
    } else if !matches!(x.dtype(), Dtype::Bfloat16 | Dtype::Float16) || scales.dtype() != x.dtype() || biases.is_some_and(|b| b.dtype() != x.dtype())
    {
        Some("dtype")
    } else if k == 0 || k % (128 / spec.bits) != 0 || k % spec.group_size != 0 {
        Some("input width")
    } else {
        None
    }
}

/// The rows of x [..., K]: the product of its leading axes.
pub(super) fn rows(x: &Array) -> i64 {
    let shape = x.shape();
    shape[..shape.len().saturating_sub(1)].iter().map(|&d| d as i64).product()
}

/// The rows of x when the dense kernel takes x and W (x of [`MIN_ROWS`] to
/// [`MAX_ROWS`] rows, weights it reads), else None.
fn dense_rows(x: &Array, w: Packed, spec: QuantSpec) -> Option<i32> {
    let shape = x.shape();
    let k = shape.last().copied().unwrap_or(0);
    let rows = rows(x);
    let fits = !shape.is_empty() && (min_rows()..=MAX_ROWS as i64).contains(&rows) && w.w.ndim() == 2;
    (fits && unsupported(x, k, w.scales, w.biases, spec).is_none()).then_some(rows as i32)
}

/// x [..., K] @ Wᵀ for W [N, K] quantized by `spec`, or None where the kernel
/// does not apply (the caller runs MLX's quantized_matmul): x of
/// [`MIN_ROWS`] to [`MAX_ROWS`] rows.
pub fn matmul(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, spec: QuantSpec) -> Result<Option<Array>> {
    let w = Packed { w, scales, biases };
    let Some(rows) = dense_rows(x, w, spec) else { return Ok(None) };
    if !in_use() {
        return Ok(None);
    }
    let tiles = Tiles::choose(rows, w.w.dim(0)?, x.dim(-1)?, spec.bits, 1);
    Ok(Some(launch_dense(x, None, w, Epilogue::Plain, spec, tiles)?))
}

/// [`matmul`] with a chosen tiling, the kernel only (no fallback): for the
/// tests and the kernel benchmark.
pub fn matmul_tiled(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, spec: QuantSpec, tiles: Tiles) -> Result<Array> {
    launch_dense(x, None, Packed { w, scales, biases }, Epilogue::Plain, spec, tiles.check(false)?)
}

/// rms_norm(x, norm) @ Wᵀ in one launch: x is a layer's residual stream and
/// `norm` the RMS norm before the product. None where [`matmul`] declines,
/// or the fused forms are turned off (`MLX_SERVE_QMM_FUSED=0`) or the norm's
/// weight does not fit x.
pub fn matmul_normed(x: &Array, norm: Norm, w: Packed, spec: QuantSpec) -> Result<Option<Array>> {
    let Some(rows) = dense_rows(x, w, spec) else { return Ok(None) };
    if !norm.fits(x) || !fused_in_use() {
        return Ok(None);
    }
    let tiles = Tiles::choose(rows, w.w.dim(0)?, x.dim(-1)?, spec.bits, 1);
    Ok(Some(launch_dense(x, Some(norm), w, Epilogue::Plain, spec, tiles)?))
}

/// [`matmul_normed`] with a chosen tiling, the kernel only.
pub fn matmul_normed_tiled(x: &Array, norm: Norm, w: Packed, spec: QuantSpec, tiles: Tiles) -> Result<Array> {
    launch_dense(x, Some(norm), w, Epilogue::Plain, spec, tiles.check(false)?)
}

/// residual + x @ Wᵀ (MLX's add of the two, the product rounded first) in
/// one launch, for `residual` shaped as the product; None where [`matmul`]
/// declines, or the fused forms are turned off (`MLX_SERVE_QMM_FUSED=0`) or
/// the residual's shape or dtype differs.
pub fn matmul_add(x: &Array, w: Packed, residual: &Array, spec: QuantSpec) -> Result<Option<Array>> {
    let Some(rows) = dense_rows(x, w, spec) else { return Ok(None) };
    let shape = x.shape();
    let fits = residual.dtype() == x.dtype() && residual.shape() == [&shape[..shape.len() - 1], &[w.w.dim(0)?]].concat();
    if !fits || !fused_in_use() {
        return Ok(None);
    }
    let tiles = Tiles::choose(rows, w.w.dim(0)?, x.dim(-1)?, spec.bits, 1);
    Ok(Some(launch_dense(x, None, w, Epilogue::Residual(residual), spec, tiles)?))
}

/// [`matmul_add`] with a chosen tiling, the kernel only.
pub fn matmul_add_tiled(x: &Array, w: Packed, residual: &Array, spec: QuantSpec, tiles: Tiles) -> Result<Array> {
    launch_dense(x, None, w, Epilogue::Residual(residual), spec, tiles.check(false)?)
}

/// silu(x @ gateᵀ) * (x @ upᵀ) for two weights of one shape quantized by
/// `spec` (an MLP's gate and up projections), in one launch: equal to the
/// kernel's two products followed by MLX's swiglu. With `norm`, x is the
/// residual stream and both products take rms_norm(x, norm) (as
/// [`matmul_normed`]). None where the kernel does not apply, as [`matmul`];
/// also where the fused forms are turned off (`MLX_SERVE_QMM_FUSED=0`), the
/// two weights differ in shape or the norm does not fit.
pub fn swiglu_matmul(x: &Array, norm: Option<Norm>, gate: Packed, up: Packed, spec: QuantSpec) -> Result<Option<Array>> {
    let Some(rows) = dense_rows(x, gate, spec) else { return Ok(None) };
    let fits = same_shapes(gate, up) && unsupported(x, x.dim(-1)?, up.scales, up.biases, spec).is_none() && norm.is_none_or(|n| n.fits(x));
    if !fits || !fused_in_use() {
        return Ok(None);
    }
    let tiles = Tiles::choose_for(rows, gate.w.dim(0)?, x.dim(-1)?, spec.bits, 1, true);
    Ok(Some(launch_dense(x, norm, gate, Epilogue::Gated(up), spec, tiles)?))
}

/// [`swiglu_matmul`] with a chosen tiling, the kernel only.
pub fn swiglu_matmul_tiled(x: &Array, norm: Option<Norm>, gate: Packed, up: Packed, spec: QuantSpec, tiles: Tiles) -> Result<Array> {
    if !same_shapes(gate, up) {
        return Err(Error::Config("gate and up weights of different shapes".into()));
    }
    launch_dense(x, norm, gate, Epilogue::Gated(up), spec, tiles.check(true)?)
}

/// Whether two weights have the same shapes (packed, scales, biases).
fn same_shapes(a: Packed, b: Packed) -> bool {
    a.w.shape() == b.w.shape()
        && a.scales.shape() == b.scales.shape()
        && a.biases.map(|x| x.shape()) == b.biases.map(|x| x.shape())
        && a.w.dtype() == b.w.dtype()
}

/// What a launch does with the product besides writing it.
#[derive(Clone, Copy)]
enum Epilogue<'a> {
    Plain,
    /// silu(product) * (x @ upᵀ).
    Gated(Packed<'a>),
    /// residual + product.
    Residual(&'a Array),
}

impl Epilogue<'_> {
    /// Its kernels' place in [`KERNELS`] (after the gathered flag).
    fn index(self) -> usize {
        match self {
            Epilogue::Plain => 0,
            Epilogue::Gated(_) => 1,
            Epilogue::Residual(_) => 2,
        }
    }
}

fn launch_dense(x: &Array, norm: Option<Norm>, w: Packed, epilogue: Epilogue, spec: QuantSpec, tiles: Tiles) -> Result<Array> {
    let n = w.w.dim(0)?;
    let mut shape = x.shape();
    *shape.last_mut().ok_or(Error::Internal("x has no axis"))? = n;
    let inputs = kernel_inputs(x, norm, w, epilogue)?;
    launch(&inputs, shape, n, 1, spec, tiles, None, epilogue, norm.map(|n| n.eps))
}

/// The kernel's inputs in its order, but for a gathered call's `idx`: x,
/// the norm's weight, the weight's packed values, scales and biases, then
/// the up weight's (gated) or the residual.
fn kernel_inputs<'a>(x: &'a Array, norm: Option<Norm<'a>>, w: Packed<'a>, epilogue: Epilogue<'a>) -> Result<Vec<&'a Array>> {
    let mut inputs = vec![x];
    inputs.extend(norm.map(|n| n.weight));
    let mut push_weight = |p: Packed<'a>| -> Result<()> {
        let biases = p.biases.ok_or(Error::Internal("the quantized-matmul kernel needs biases"))?;
        inputs.extend([p.w, p.scales, biases]);
        Ok(())
    };
    push_weight(w)?;
    match epilogue {
        Epilogue::Plain => {}
        Epilogue::Gated(up) => push_weight(up)?,
        Epilogue::Residual(r) => inputs.push(r),
    }
    Ok(inputs)
}

/// MLX's gather_qmm(x, W, rhs_indices = indices, transpose) for W stacked
/// [E, N, K]: x [..., 1, K] whose leading axes equal the indices' shape or
/// that shape with its last axis 1 (each row through each of its experts);
/// the result is [..indices' shape, 1, N]. None where the kernel does not
/// apply.
pub fn gather(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, indices: &Array, spec: QuantSpec) -> Result<Option<Array>> {
    let w = Packed { w, scales, biases };
    let Some(per_row) = gather_rows(x, w, indices, spec) else { return Ok(None) };
    if !in_use() {
        return Ok(None);
    }
    let tiles = Tiles::choose(1, w.w.dim(1)?, x.dim(-1)?, spec.bits, indices.size() as i32);
    Ok(Some(launch_gather(x, w, Epilogue::Plain, indices, per_row, spec, tiles)?))
}

/// [`gather`]'s gated form: silu(gate) * up of each row's experts, as
/// [`swiglu_matmul`] is [`matmul`]'s, for stacked gate and up weights of one
/// shape. None where the kernel or gating does not apply.
pub fn swiglu_gather(x: &Array, gate: Packed, up: Packed, indices: &Array, spec: QuantSpec) -> Result<Option<Array>> {
    let Some(per_row) = gather_rows(x, gate, indices, spec) else { return Ok(None) };
    if !same_shapes(gate, up) || unsupported(x, x.dim(-1)?, up.scales, up.biases, spec).is_some() || !fused_in_use() {
        return Ok(None);
    }
    let tiles = Tiles::choose_for(1, gate.w.dim(1)?, x.dim(-1)?, spec.bits, indices.size() as i32, true);
    Ok(Some(launch_gather(x, gate, Epilogue::Gated(up), indices, per_row, spec, tiles)?))
}

/// The rows of x each of its rows feeds (1, or the indices' last axis) when
/// the gathered kernel takes this call's shapes and weights, else None.
fn gather_rows(x: &Array, w: Packed, indices: &Array, spec: QuantSpec) -> Option<i32> {
    let (xs, is) = (x.shape(), indices.shape());
    let pairs = indices.size() as i32;
    if xs.len() < 2 || xs[xs.len() - 2] != 1 || w.w.ndim() != 3 || pairs == 0 || pairs > MAX_PAIRS {
        return None;
    }
    let lead = &xs[..xs.len() - 2];
    let per_row = match is.split_last() {
        _ if lead == is.as_slice() => 1,
        Some((&last, rest)) if lead.len() == is.len() && &lead[..rest.len()] == rest && lead[rest.len()] == 1 => last,
        _ => return None,
    };
    unsupported(x, xs[xs.len() - 1], w.scales, w.biases, spec).is_none().then_some(per_row)
}

/// [`gather`] with the rows per x row (`per_row`: 1, or the indices' last
/// axis) and the tiling given, the kernel only.
#[allow(clippy::too_many_arguments)]
pub fn gather_tiled(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    indices: &Array,
    per_row: i32,
    spec: QuantSpec,
    tiles: Tiles,
) -> Result<Array> {
    launch_gather(x, Packed { w, scales, biases }, Epilogue::Plain, indices, per_row, spec, tiles.check(false)?)
}

/// [`swiglu_gather`] with `per_row` and the tiling given, the kernel only.
pub fn swiglu_gather_tiled(x: &Array, gate: Packed, up: Packed, indices: &Array, per_row: i32, spec: QuantSpec, tiles: Tiles) -> Result<Array> {
    if !same_shapes(gate, up) {
        return Err(Error::Config("gate and up weights of different shapes".into()));
    }
    launch_gather(x, gate, Epilogue::Gated(up), indices, per_row, spec, tiles.check(true)?)
}

fn launch_gather(x: &Array, w: Packed, epilogue: Epilogue, indices: &Array, per_row: i32, spec: QuantSpec, tiles: Tiles) -> Result<Array> {
    let n = w.w.dim(1)?;
    let cast;
    let idx = if indices.dtype() == Dtype::Uint32 {
        indices
    } else {
        cast = ops::astype(indices, Dtype::Uint32)?;
        &cast
    };
    let shape = [indices.shape(), vec![1, n]].concat();
    if let Epilogue::Residual(_) = epilogue {
        return Err(Error::Internal("the gathered kernel adds no residual"));
    }
    let mut inputs = kernel_inputs(x, None, w, epilogue)?;
    inputs.push(idx);
    launch(&inputs, shape, n, indices.size() as i32, spec, tiles, Some(per_row), epilogue, None)
}

/// One launch: a block per RT×16 output features (per pair when gathered),
/// the output `shape` row-major.
#[allow(clippy::too_many_arguments)]
fn launch(
    inputs: &[&Array],
    shape: Vec<i32>,
    n: i32,
    pairs: i32,
    spec: QuantSpec,
    tiles: Tiles,
    per_row: Option<i32>,
    epilogue: Epilogue,
    norm_eps: Option<f32>,
) -> Result<Array> {
    let dtype = inputs[0].dtype();
    let mut template = vec![("T".to_string(), TemplateArg::Dtype(dtype))];
    let ints = [
        ("BITS", spec.bits),
        ("GS", spec.group_size),
        ("RT", tiles.rt),
        ("MT", tiles.mt),
        ("WK", tiles.wk),
    ];
    template.extend(ints.iter().map(|(k, v)| (k.to_string(), TemplateArg::Int(*v))));
    if let Some(div) = per_row {
        template.push(("DIV".to_string(), TemplateArg::Int(div)));
    }
    if let Some(eps) = norm_eps {
        // A float as its bits: template constants are integers.
        template.push(("EPS_BITS".to_string(), TemplateArg::Int(eps.to_bits() as i32)));
    }
    let blocks = (n + 16 * tiles.rt - 1) / (16 * tiles.rt);
    let call = KernelCall {
        outputs: vec![(shape, dtype)],
        grid: (blocks * 32 * tiles.wk, pairs, 1),
        thread_group: (32 * tiles.wk, 1, 1),
        template,
        ..Default::default()
    };
    let out = KERNELS.with(|k| match &k[per_row.is_some() as usize][epilogue.index()][norm_eps.is_some() as usize] {
        Some(kernel) => Ok(kernel.apply(inputs, &call)?),
        None => Err(Error::Internal("the quantized-matmul kernel did not compile")),
    })?;
    out.into_iter()
        .next()
        .ok_or(Error::Internal("the quantized-matmul kernel returned no array"))
}

thread_local! {
    /// The dense kernels, then the gathered ones, each plain, gated and with
    /// a residual ([`Epilogue`]), each as is and normed: None off CUDA and
    /// for the forms that do not exist (gathered with a residual or normed,
    /// normed with a residual).
    static KERNELS: [[[Option<CustomKernel>; 2]; 3]; 2] = [
        [
            [make_kernel(false, 0, false), make_kernel(false, 0, true)],
            [make_kernel(false, 1, false), make_kernel(false, 1, true)],
            [make_kernel(false, 2, false), None],
        ],
        [[make_kernel(true, 0, false), None], [make_kernel(true, 1, false), None], [None, None]],
    ];
}

/// The kernel of this form (`epilogue`: an [`Epilogue::index`]; `normed`:
/// x normalized first).
fn make_kernel(gathered: bool, epilogue: usize, normed: bool) -> Option<CustomKernel> {
    if gpu_backend() != Some("cuda") {
        return None;
    }
    let (gated, residual) = (epilogue == 1, epilogue == 2);
    let header = format!(
        "#define QMM_GATHER {}\n#define QMM_GLU {}\n#define QMM_RESIDUAL {}\n#define QMM_NORM {}\n{HEADER}",
        gathered as i32, gated as i32, residual as i32, normed as i32
    );
    let mut inputs = vec!["x"];
    if normed {
        inputs.push("nw");
    }
    inputs.extend(["w", "scales", "biases"]);
    if gated {
        inputs.extend(["w_up", "scales_up", "biases_up"]);
    }
    if residual {
        inputs.push("res");
    }
    if gathered {
        inputs.push("idx");
    }
    let name = match (gathered, epilogue, normed) {
        (false, 0, false) => "quant_matmul",
        (false, 0, true) => "quant_matmul_normed",
        (true, 0, _) => "quant_matmul_gather",
        (false, 1, false) => "quant_matmul_glu",
        (false, 1, true) => "quant_matmul_glu_normed",
        (true, 1, _) => "quant_matmul_glu_gather",
        _ => "quant_matmul_residual",
    };
    let src = KernelSource {
        header: &header,
        ..KernelSource::new(name, &inputs, &["y"], SOURCE)
    };
    CustomKernel::cuda(&src).map_err(|e| log::warn!("quantized-matmul kernel: {e}")).ok()
}

/// Whether the kernel serves calls on this thread's device: CUDA, the GPU
/// current, not turned off, and its start-up check passed (once a process).
pub fn in_use() -> bool {
    mlx_rs_safe::kernels::current_gpu_backend().is_some() && usable()
}

/// Whether the gated and residual forms serve calls: 0 off, 1 on, 2 not yet
/// read from the environment.
static FUSED: AtomicU8 = AtomicU8::new(2);

/// Turns the gated and residual forms on or off for this process (a
/// benchmark comparing them in one process; the environment sets the start).
pub fn set_fused(on: bool) {
    FUSED.store(on as u8, Ordering::Relaxed);
}

/// Whether the gated and residual forms serve calls: the kernel is in use
/// and they are not turned off (`MLX_SERVE_QMM_FUSED=0`).
fn fused_in_use() -> bool {
    if !in_use() {
        return false;
    }
    match FUSED.load(Ordering::Relaxed) {
        2 => {
            let off = crate::kernel_check::turned_off("MLX_SERVE_QMM_FUSED", "separate products, MLX's swiglu and MLX's residual adds");
            // A bench's set_fused in the meantime wins.
            let _ = FUSED.compare_exchange(2, !off as u8, Ordering::Relaxed, Ordering::Relaxed);
            FUSED.load(Ordering::Relaxed) == 1
        }
        v => v == 1,
    }
}

fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        gpu_backend() == Some("cuda")
            && crate::kernel_check::serves(
                "MLX_SERVE_QMM_KERNEL",
                "quantized matmul uses MLX's kernels",
                "quantized matmul: the CUDA kernel",
                "MLX's kernels",
                self_check,
            )
    })
}

/// The float32 reference: x @ dequantize(W)ᵀ, both in float32.
pub fn reference(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, spec: QuantSpec) -> Result<Array> {
    let wf = quantized::dequantize_with(w, scales, biases, spec, Some(Dtype::Float32))?;
    Ok(ops::matmul(&ops::astype(x, Dtype::Float32)?, &ops::swapaxes(&wf, -1, -2)?)?)
}

/// A few products of each kind (4 and 8 bits, dense and gathered) against
/// the float32 reference; None when they agree within bfloat16 rounding.
pub fn self_check() -> Result<Option<String>> {
    use mlx_rs_safe::random;
    let (n, k) = (64, 256);
    let normal = |shape: &[i32], seed: u64| random::normal(shape, Dtype::Float32, 0.0, 1.0, &random::key(seed)?);
    for bits in [4, 8] {
        let spec = QuantSpec::affine(64, bits);
        let wf = normal(&[2, n, k], 1)?;
        let (w, scales, biases) = quantized::quantize(&ops::astype(&wf, Dtype::Bfloat16)?, spec.group_size, bits)?;
        let x = ops::astype(&normal(&[3, 1, k], 2)?, Dtype::Bfloat16)?;
        let first = |a: &Array| ops::take(a, &Array::scalar(0i32), 0);
        let (w0, s0, b0) = (first(&w)?, first(&scales)?, first(&biases)?);
        let dense = matmul_tiled(&x, &w0, &s0, Some(&b0), spec, Tiles::choose(3, n, k, bits, 1))?;
        let want = reference(&x, &w0, &s0, Some(&b0), spec)?;
        if let Some(why) = disagreement(&dense, &want)? {
            return Ok(Some(format!("{bits}-bit: {why}")));
        }
        let idx = Array::from_slice(&[1u32, 0, 1], &[3])?;
        let got = gather_tiled(
            &ops::reshape(&x, &[3, 1, 1, k])?,
            &w,
            &scales,
            Some(&biases),
            &idx,
            1,
            spec,
            Tiles::choose(1, n, k, bits, 3),
        )?;
        // The gated forms: gate from `w`, up from a second stack.
        let (wu, su, bu) = quantized::quantize(&ops::astype(&normal(&[2, n, k], 3)?, Dtype::Bfloat16)?, spec.group_size, bits)?;
        let (gate, up) = (Packed { w: &w, scales: &scales, biases: Some(&biases) }, Packed { w: &wu, scales: &su, biases: Some(&bu) });
        let gated = swiglu_gather_tiled(&ops::reshape(&x, &[3, 1, 1, k])?, gate, up, &idx, 1, spec, Tiles::choose_for(1, n, k, bits, 3, true))?;
        let (u0, us0, ub0) = (first(&wu)?, first(&su)?, first(&bu)?);
        let gated_dense = swiglu_matmul_tiled(
            &x,
            None,
            Packed { w: &w0, scales: &s0, biases: Some(&b0) },
            Packed { w: &u0, scales: &us0, biases: Some(&ub0) },
            spec,
            Tiles::choose_for(3, n, k, bits, 1, true),
        )?;
        let gated_want = |x: &Array, e: i32| -> Result<Array> {
            let pick = |a: &Array| ops::take(a, &Array::scalar(e), 0);
            let product = |w: &Array, s: &Array, b: &Array| -> Result<Array> {
                Ok(ops::astype(&reference(x, &pick(w)?, &pick(s)?, Some(&pick(b)?), spec)?, Dtype::Bfloat16)?)
            };
            super::mlp::swiglu(&product(&w, &scales, &biases)?, &product(&wu, &su, &bu)?)
        };
        if let Some(why) = disagreement(&gated_dense, &gated_want(&x, 0)?)? {
            return Ok(Some(format!("{bits}-bit gated: {why}")));
        }
        // The normed forms: rms_norm(x) first, alone and gated.
        let nw = ops::astype(&normal(&[k], 5)?, Dtype::Bfloat16)?;
        let norm = Norm { weight: &nw, eps: 1e-5 };
        let normed_x = mlx_rs_safe::fast::rms_norm(&x, Some(&nw), 1e-5)?;
        let normed = matmul_normed_tiled(&x, norm, Packed { w: &w0, scales: &s0, biases: Some(&b0) }, spec, Tiles::choose(3, n, k, bits, 1))?;
        if let Some(why) = disagreement(&normed, &reference(&normed_x, &w0, &s0, Some(&b0), spec)?)? {
            return Ok(Some(format!("{bits}-bit normed: {why}")));
        }
        let normed_gated = swiglu_matmul_tiled(
            &x,
            Some(norm),
            Packed { w: &w0, scales: &s0, biases: Some(&b0) },
            Packed { w: &u0, scales: &us0, biases: Some(&ub0) },
            spec,
            Tiles::choose_for(3, n, k, bits, 1, true),
        )?;
        if let Some(why) = disagreement(&normed_gated, &gated_want(&normed_x, 0)?)? {
            return Ok(Some(format!("{bits}-bit normed and gated: {why}")));
        }
        let residual = ops::astype(&normal(&[3, 1, n], 4)?, Dtype::Bfloat16)?;
        let added = matmul_add_tiled(&x, Packed { w: &w0, scales: &s0, biases: Some(&b0) }, &residual, spec, Tiles::choose(3, n, k, bits, 1))?;
        let want_added = ops::add(&residual, &ops::astype(&want, Dtype::Bfloat16)?)?;
        if let Some(why) = disagreement(&added, &want_added)? {
            return Ok(Some(format!("{bits}-bit with a residual: {why}")));
        }
        for (row, e) in [(0, 1), (1, 0), (2, 1)] {
            let pick = |a: &Array, i: i32| ops::take(a, &Array::scalar(i), 0);
            let want = reference(&pick(&x, row)?, &pick(&w, e)?, &pick(&scales, e)?, Some(&pick(&biases, e)?), spec)?;
            if let Some(why) = disagreement(&ops::reshape(&pick(&got, row)?, &[1, n])?, &want)? {
                return Ok(Some(format!("{bits}-bit gathered: {why}")));
            }
            let want = gated_want(&pick(&x, row)?, e)?;
            if let Some(why) = disagreement(&ops::reshape(&pick(&gated, row)?, &[1, n])?, &want)? {
                return Ok(Some(format!("{bits}-bit gated and gathered: {why}")));
            }
        }
    }
    Ok(None)
}

/// Why `got` (bfloat16 or float16) is farther from `want` than 16-bit
/// rounding allows, or None. The kernel rounds each dequantized weight to 16
/// bits (as MLX's dequantize does) and the result: together a few units in
/// the last place of the largest output; a wrong layout is off by the
/// outputs' own size.
pub fn disagreement(got: &Array, want: &Array) -> Result<Option<String>> {
    let want = ops::astype(want, Dtype::Float32)?;
    let diff = ops::abs(&ops::subtract(&ops::astype(got, Dtype::Float32)?, &want)?)?;
    let scale = ops::max_all(&ops::abs(&want)?, false)?.item::<f32>()?;
    let worst = ops::max_all(&diff, false)?.item::<f32>()?;
    let allowed = scale / 64.0;
    Ok((!worst.is_finite() || worst > allowed).then(|| format!("max difference {worst}, {allowed} allowed (largest output {scale})")))
}
