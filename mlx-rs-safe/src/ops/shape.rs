//! Reshaping, transposing, slicing, joining and splitting.

use crate::array::Array;
use crate::error::Result;
use crate::ops::int_slice;

/// The same elements with a new shape (one entry may be -1).
pub fn reshape(a: &Array, shape: &[i32]) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { mlx_sys::mlx_reshape(res, a.raw, p, n, s) }
    })
}

/// A copy with elements converted to `dtype`.
pub fn astype(a: &Array, dtype: crate::Dtype) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { mlx_sys::mlx_astype(res, a.raw, dtype.to_sys(), s) }
    })
}

/// Reverses the axes.
pub fn transpose(a: &Array) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { mlx_sys::mlx_transpose(res, a.raw, s) }
    })
}
