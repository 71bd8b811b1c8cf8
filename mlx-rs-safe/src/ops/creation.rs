//! New arrays: constants, ranges and identity-like matrices.

use mlx_sys as sys;

use crate::array::Array;
use crate::error::Result;
use crate::ops::{c_len, int_slice};
use crate::Dtype;

/// An array of `shape` filled with 0.
pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; valid out handle and stream.
        unsafe { sys::mlx_zeros(res, p, n, dtype.to_sys(), s) }
    })
}

/// An array of `shape` filled with 1.
pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; valid out handle and stream.
        unsafe { sys::mlx_ones(res, p, n, dtype.to_sys(), s) }
    })
}

/// An array of `shape` filled with `value` (broadcast to `shape`), cast to `dtype`.
pub fn full(shape: &[i32], value: &Array, dtype: Dtype) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_full(res, p, n, value.raw, dtype.to_sys(), s) }
    })
}

/// Zeros with the shape and dtype of `a`.
pub fn zeros_like(a: &Array) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_zeros_like(res, a.raw, s) }
    })
}

/// Ones with the shape and dtype of `a`.
pub fn ones_like(a: &Array) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_ones_like(res, a.raw, s) }
    })
}

/// `start, start + step, ...` up to but excluding `stop`.
pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: valid out handle and stream.
        unsafe { sys::mlx_arange(res, start, stop, step, dtype.to_sys(), s) }
    })
}

/// `num` evenly spaced values from `start` to `stop`, both included.
pub fn linspace(start: f64, stop: f64, num: usize, dtype: Dtype) -> Result<Array> {
    let num = c_len(num, "linspace points")?;
    Array::build_s(|res, s| {
        // SAFETY: valid out handle and stream.
        unsafe { sys::mlx_linspace(res, start, stop, num, dtype.to_sys(), s) }
    })
}

/// An `n x m` matrix with ones on the `k`-th diagonal (0: main, > 0: above).
pub fn eye(n: i32, m: i32, k: i32, dtype: Dtype) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: valid out handle and stream.
        unsafe { sys::mlx_eye(res, n, m, k, dtype.to_sys(), s) }
    })
}

/// The `n x n` identity matrix.
pub fn identity(n: i32, dtype: Dtype) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: valid out handle and stream.
        unsafe { sys::mlx_identity(res, n, dtype.to_sys(), s) }
    })
}

/// An `n x m` matrix with ones on and below the `k`-th diagonal, zeros above.
pub fn tri(n: i32, m: i32, k: i32, dtype: Dtype) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: valid out handle and stream.
        unsafe { sys::mlx_tri(res, n, m, k, dtype.to_sys(), s) }
    })
}
