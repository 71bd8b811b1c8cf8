//! MLX quantization: quantize/dequantize, matmuls on quantized weights (also
//! gathered per expert, for MoE), and the Hadamard transform.
//!
//! The plain functions ([`quantize`], [`dequantize`], [`quantized_matmul`],
//! [`gather_qmm`]) use MLX's affine scheme, the one mlx-lm checkpoints carry. The
//! `_with` variants take a [`QuantSpec`] and so also reach the microscaling float
//! modes (mxfp4, mxfp8, nvfp4), which have no biases.

use std::ffi::CStr;

use mlx_sys as sys;

use crate::array::Array;
use crate::device::with_current;
use crate::dtype::Dtype;
use crate::error::{check, Error, Result};
use crate::optional::{opt_dtype, opt_float, opt_int, raw_or_null};
use crate::transforms::VectorArray;

/// A quantization scheme of MLX (its `mode` string).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantMode {
    /// Per group: w ≈ scale · q + bias, q an unsigned `bits`-bit integer.
    Affine,
    /// OCP MX fp4 (e2m1 values, power-of-two e8m0 scale per 32).
    Mxfp4,
    /// OCP MX fp8 (e4m3 values, power-of-two e8m0 scale per 32).
    Mxfp8,
    /// NVIDIA fp4 (e2m1 values, e4m3 scale per 16).
    Nvfp4,
}

impl QuantMode {
    pub const ALL: [QuantMode; 4] = [QuantMode::Affine, QuantMode::Mxfp4, QuantMode::Mxfp8, QuantMode::Nvfp4];

    /// The mode MLX calls `name`, if any.
    pub fn from_name(name: &str) -> Option<QuantMode> {
        QuantMode::ALL.into_iter().find(|m| m.as_str() == name)
    }

    /// MLX's name of the mode ("affine", "mxfp4", ...).
    pub fn as_str(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Mxfp8 => "mxfp8",
            QuantMode::Nvfp4 => "nvfp4",
        }
    }

    fn c_name(self) -> &'static CStr {
        match self {
            QuantMode::Affine => c"affine",
            QuantMode::Mxfp4 => c"mxfp4",
            QuantMode::Mxfp8 => c"mxfp8",
            QuantMode::Nvfp4 => c"nvfp4",
        }
    }

    /// Whether the mode stores a bias per group next to the scale.
    pub fn has_biases(self) -> bool {
        self == QuantMode::Affine
    }
}

/// Group size, bit width and scheme of a quantized tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    /// Elements of the last axis sharing one scale (and bias).
    pub group_size: i32,
    /// Bits per quantized element.
    pub bits: i32,
    /// The scheme.
    pub mode: QuantMode,
}

impl QuantSpec {
    /// The affine scheme with the given group size and bits.
    pub fn affine(group_size: i32, bits: i32) -> QuantSpec {
        QuantSpec { group_size, bits, mode: QuantMode::Affine }
    }

    /// MLX's defaults for `mode`: affine 64/4, mxfp4 32/4, mxfp8 32/8, nvfp4 16/4.
    pub fn default_for(mode: QuantMode) -> QuantSpec {
        let (group_size, bits) = match mode {
            QuantMode::Affine => (64, 4),
            QuantMode::Mxfp4 => (32, 4),
            QuantMode::Mxfp8 => (32, 8),
            QuantMode::Nvfp4 => (16, 4),
        };
        QuantSpec { group_size, bits, mode }
    }
}

/// `w` quantized along its last axis with `spec`: (packed weight, scales, biases);
/// the biases are present for the affine mode only.
pub fn quantize_with(w: &Array, spec: QuantSpec) -> Result<(Array, Array, Option<Array>)> {
    let mut out = VectorArray::empty();
    with_current(|s| {
        // SAFETY: live input handle and stream; `out.raw` is a live vector that
        // mlx-c fills (and `out` frees); the mode string is static and
        // NUL-terminated; the global scale is the null handle (none).
        check(unsafe {
            sys::mlx_quantize(
                &mut out.raw,
                w.raw,
                opt_int(Some(spec.group_size)),
                opt_int(Some(spec.bits)),
                spec.mode.c_name().as_ptr(),
                raw_or_null(None),
                s,
            )
        })
    })??;
    let mut parts = out.into_arrays()?.into_iter();
    match (parts.next(), parts.next()) {
        (Some(q), Some(scales)) => Ok((q, scales, parts.next())),
        _ => Err(Error::Mlx("quantize returned fewer than 2 arrays".into())),
    }
}

/// `w` affine-quantized along its last axis in groups of `group_size` with `bits`
/// bits: (packed weight, scales, biases).
pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<(Array, Array, Array)> {
    match quantize_with(w, QuantSpec::affine(group_size, bits))? {
        (q, s, Some(b)) => Ok((q, s, b)),
        _ => Err(Error::Mlx("affine quantize returned no biases".into())),
    }
}

/// The float weight of a quantized one, in `dtype` (default: the scales' dtype
/// for affine; bfloat16 for the float modes, whose scales are uint8).
pub fn dequantize_with(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    spec: QuantSpec,
    dtype: Option<Dtype>,
) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles and stream; biases and the global scale may be the
        // null handle; the mode string is static and NUL-terminated.
        unsafe {
            sys::mlx_dequantize(
                res,
                w.raw,
                scales.raw,
                raw_or_null(biases),
                opt_int(Some(spec.group_size)),
                opt_int(Some(spec.bits)),
                spec.mode.c_name().as_ptr(),
                raw_or_null(None),
                opt_dtype(dtype),
                s,
            )
        }
    })
}

/// The float weight of an affine-quantized one (in the scales' dtype).
pub fn dequantize(w: &Array, scales: &Array, biases: Option<&Array>, group_size: i32, bits: i32) -> Result<Array> {
    dequantize_with(w, scales, biases, QuantSpec::affine(group_size, bits), None)
}

/// [`dequantize`] into a chosen dtype.
pub fn dequantize_as(
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    group_size: i32,
    bits: i32,
    dtype: Option<Dtype>,
) -> Result<Array> {
    dequantize_with(w, scales, biases, QuantSpec::affine(group_size, bits), dtype)
}

/// x @ Wᵀ (`transpose`) or x @ W with W quantized with `spec`.
pub fn quantized_matmul_with(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    spec: QuantSpec,
) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles and stream; biases may be the null handle; the
        // mode string is static and NUL-terminated.
        unsafe {
            sys::mlx_quantized_matmul(
                res,
                x.raw,
                w.raw,
                scales.raw,
                raw_or_null(biases),
                transpose,
                opt_int(Some(spec.group_size)),
                opt_int(Some(spec.bits)),
                spec.mode.c_name().as_ptr(),
                s,
            )
        }
    })
}

/// x @ Wᵀ (`transpose`) or x @ W with W affine-quantized.
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    quantized_matmul_with(x, w, scales, biases, transpose, QuantSpec::affine(group_size, bits))
}

/// Quantized matmul where each row of `x` picks its weight matrix from a stack
/// (`w` [E, out, in/packing]) by `rhs_indices` (and its own batch entry by
/// `lhs_indices`) — the MoE "switch" layer. `sorted_indices` promises that
/// `rhs_indices` is sorted, which lets MLX group rows per expert.
#[allow(clippy::too_many_arguments)]
pub fn gather_qmm_with(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    transpose: bool,
    spec: QuantSpec,
    sorted_indices: bool,
) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles and stream; the optional arrays may be null
        // handles; the mode string is static and NUL-terminated.
        unsafe {
            sys::mlx_gather_qmm(
                res,
                x.raw,
                w.raw,
                scales.raw,
                raw_or_null(biases),
                raw_or_null(lhs_indices),
                raw_or_null(rhs_indices),
                transpose,
                opt_int(Some(spec.group_size)),
                opt_int(Some(spec.bits)),
                spec.mode.c_name().as_ptr(),
                sorted_indices,
                s,
            )
        }
    })
}

/// [`gather_qmm_with`] for affine-quantized weights.
#[allow(clippy::too_many_arguments)]
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    transpose: bool,
    group_size: i32,
    bits: i32,
    sorted_indices: bool,
) -> Result<Array> {
    let spec = QuantSpec::affine(group_size, bits);
    gather_qmm_with(x, w, scales, biases, lhs_indices, rhs_indices, transpose, spec, sorted_indices)
}

/// Matmul with per-row choice of matrices from stacks `a`/`b` (unquantized MoE).
pub fn gather_mm(
    a: &Array,
    b: &Array,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    sorted_indices: bool,
) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles and stream; the index arrays may be null handles.
        unsafe {
            sys::mlx_gather_mm(res, a.raw, b.raw, raw_or_null(lhs_indices), raw_or_null(rhs_indices), sorted_indices, s)
        }
    })
}

/// The Walsh–Hadamard transform over the last axis (scaled by `scale`, default 1/√n).
pub fn hadamard_transform(a: &Array, scale: Option<f32>) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handle and stream; the optional scale is passed by value.
        unsafe { sys::mlx_hadamard_transform(res, a.raw, opt_float(scale), s) }
    })
}
