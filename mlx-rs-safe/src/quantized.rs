//! MLX affine quantization: quantize/dequantize, matmuls on quantized weights
//! (also gathered per expert, for MoE), and the Hadamard transform.

use mlx_sys as sys;

use crate::array::Array;
use crate::dtype::Dtype;
use crate::device::with_current;
use crate::error::{check, Result};
use crate::optional::{opt_dtype, opt_float, opt_int, raw_or_null};
use crate::transforms::VectorArray;

const AFFINE: &std::ffi::CStr = c"affine";

/// `w` quantized along its last axis in groups of `group_size` with `bits` bits:
/// (packed weight, scales, biases).
pub fn quantize(w: &Array, group_size: i32, bits: i32) -> Result<(Array, Array, Array)> {
    let mut out = VectorArray::empty();
    with_current(|s| {
        // SAFETY: live handles; `out.raw` is a valid out vector; the global scale is null.
        check(unsafe {
            sys::mlx_quantize(
                &mut out.raw,
                w.raw,
                opt_int(Some(group_size)),
                opt_int(Some(bits)),
                AFFINE.as_ptr(),
                raw_or_null(None),
                s,
            )
        })
    })??;
    let mut parts = out.into_arrays()?.into_iter();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(q), Some(s), Some(b)) => Ok((q, s, b)),
        _ => Err(crate::Error::Mlx("quantize returned fewer than 3 arrays".into())),
    }
}

/// The float weight of a quantized one (in `dtype`, default: the scales' dtype).
pub fn dequantize(w: &Array, scales: &Array, biases: Option<&Array>, group_size: i32, bits: i32) -> Result<Array> {
    dequantize_as(w, scales, biases, group_size, bits, None)
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
    Array::build_s(|res, s| {
        // SAFETY: live handles; biases and global scale may be null handles.
        unsafe {
            sys::mlx_dequantize(
                res,
                w.raw,
                scales.raw,
                raw_or_null(biases),
                opt_int(Some(group_size)),
                opt_int(Some(bits)),
                AFFINE.as_ptr(),
                raw_or_null(None),
                opt_dtype(dtype),
                s,
            )
        }
    })
}

/// x @ Wᵀ (transpose) or x @ W with W quantized.
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: Option<&Array>,
    transpose: bool,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles; biases may be the null handle.
        unsafe {
            sys::mlx_quantized_matmul(
                res,
                x.raw,
                w.raw,
                scales.raw,
                raw_or_null(biases),
                transpose,
                opt_int(Some(group_size)),
                opt_int(Some(bits)),
                AFFINE.as_ptr(),
                s,
            )
        }
    })
}

/// Quantized matmul where each row of `x` picks its weight matrix from a stack
/// (`w` [E, out, in/packing]) by `rhs_indices` — the MoE "switch" layer.
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
    Array::build_s(|res, s| {
        // SAFETY: live handles; optional arrays may be null handles.
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
                opt_int(Some(group_size)),
                opt_int(Some(bits)),
                AFFINE.as_ptr(),
                sorted_indices,
                s,
            )
        }
    })
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
        // SAFETY: live handles; index arrays may be null handles.
        unsafe {
            sys::mlx_gather_mm(res, a.raw, b.raw, raw_or_null(lhs_indices), raw_or_null(rhs_indices), sorted_indices, s)
        }
    })
}

/// The Walsh–Hadamard transform over the last axis (scaled by `scale`, default 1/√n).
pub fn hadamard_transform(a: &Array, scale: Option<f32>) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_hadamard_transform(res, a.raw, opt_float(scale), s) }
    })
}
