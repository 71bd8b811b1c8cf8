//! Reductions (over chosen axes or the whole array), softmax and scans.
//!
//! Axes may be negative (counted from the end); `keepdims` keeps each reduced
//! axis with size 1.

use mlx_sys as sys;

use crate::array::Array;
use crate::error::Result;
use crate::ops::int_slice;

/// Defines `name(a, axes, keepdims)` over an mlx-c `*_axes` reduction and
/// `name_all(a, keepdims)` over its whole-array form.
macro_rules! reductions {
    ($($what:literal: $name:ident => $ffi_axes:ident, $all:ident => $ffi_all:ident;)*) => {$(
        #[doc = concat!($what, " over `axes`.")]
        pub fn $name(a: &Array, axes: &[i32], keepdims: bool) -> Result<Array> {
            let (p, n) = int_slice(axes);
            Array::build_s(|res, s| {
                // SAFETY: `p` points to `n` ints alive for the call; live handles.
                unsafe { sys::$ffi_axes(res, a.raw, p, n, keepdims, s) }
            })
        }

        #[doc = concat!($what, " over every element.")]
        pub fn $all(a: &Array, keepdims: bool) -> Result<Array> {
            Array::build_s(|res, s| {
                // SAFETY: live input handle, valid out handle and stream.
                unsafe { sys::$ffi_all(res, a.raw, keepdims, s) }
            })
        }
    )*};
}

reductions!(
    "Sum": sum => mlx_sum_axes, sum_all => mlx_sum;
    "Arithmetic mean": mean => mlx_mean_axes, mean_all => mlx_mean;
    "Maximum": max => mlx_max_axes, max_all => mlx_max;
    "Minimum": min => mlx_min_axes, min_all => mlx_min;
    "Product": prod => mlx_prod_axes, prod_all => mlx_prod;
    "`log(sum(exp(a)))`, computed stably,": logsumexp => mlx_logsumexp_axes,
        logsumexp_all => mlx_logsumexp;
    "Whether all elements are true (non-zero)": all => mlx_all_axes, all_all => mlx_all;
    "Whether any element is true (non-zero)": any => mlx_any_axes, any_all => mlx_any;
);

/// Variance over `axes`, dividing by `N - ddof`.
pub fn var(a: &Array, axes: &[i32], keepdims: bool, ddof: i32) -> Result<Array> {
    let (p, n) = int_slice(axes);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_var_axes(res, a.raw, p, n, keepdims, ddof, s) }
    })
}

/// Standard deviation over `axes`, dividing by `N - ddof`.
pub fn std(a: &Array, axes: &[i32], keepdims: bool, ddof: i32) -> Result<Array> {
    let (p, n) = int_slice(axes);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_std_axes(res, a.raw, p, n, keepdims, ddof, s) }
    })
}

/// Index (uint32) of the largest element along `axis` (first one on ties).
pub fn argmax(a: &Array, axis: i32, keepdims: bool) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_argmax_axis(res, a.raw, axis, keepdims, s) }
    })
}

/// Flat index (uint32) of the largest element of the whole array.
pub fn argmax_all(a: &Array, keepdims: bool) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_argmax(res, a.raw, keepdims, s) }
    })
}

/// Index (uint32) of the smallest element along `axis` (first one on ties).
pub fn argmin(a: &Array, axis: i32, keepdims: bool) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_argmin_axis(res, a.raw, axis, keepdims, s) }
    })
}

/// Flat index (uint32) of the smallest element of the whole array.
pub fn argmin_all(a: &Array, keepdims: bool) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_argmin(res, a.raw, keepdims, s) }
    })
}

/// Softmax over `axes`; `precise` accumulates half-precision inputs in float32.
pub fn softmax(a: &Array, axes: &[i32], precise: bool) -> Result<Array> {
    let (p, n) = int_slice(axes);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_softmax_axes(res, a.raw, p, n, precise, s) }
    })
}

/// Softmax over every element together.
pub fn softmax_all(a: &Array, precise: bool) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_softmax(res, a.raw, precise, s) }
    })
}

/// "No dtype override" for the scans that accept one.
fn no_dtype() -> sys::mlx_optional_dtype {
    sys::mlx_optional_dtype {
        value: sys::MLX_FLOAT32,
        has_value: false,
    }
}

/// Running sum along `axis`; `reverse` scans from the end, `inclusive` counts
/// the element itself (else the scan is shifted by one, starting at 0).
pub fn cumsum(a: &Array, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_cumsum_axis(res, a.raw, axis, reverse, inclusive, no_dtype(), s) }
    })
}

/// Running product along `axis` (see [`cumsum`] for `reverse`/`inclusive`).
pub fn cumprod(a: &Array, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_cumprod_axis(res, a.raw, axis, reverse, inclusive, no_dtype(), s) }
    })
}

/// Running maximum along `axis` (see [`cumsum`] for `reverse`/`inclusive`).
pub fn cummax(a: &Array, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_cummax_axis(res, a.raw, axis, reverse, inclusive, s) }
    })
}

/// Running `logsumexp` along `axis` (see [`cumsum`] for `reverse`/`inclusive`).
pub fn logcumsumexp(a: &Array, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_logcumsumexp_axis(res, a.raw, axis, reverse, inclusive, s) }
    })
}
