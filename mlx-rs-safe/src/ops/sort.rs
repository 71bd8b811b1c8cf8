//! Sorting, partial sorting and top-k.

use mlx_sys as sys;

use crate::array::Array;
use crate::error::Result;
use crate::ops::c_len;

/// `a` sorted ascending along `axis`.
pub fn sort(a: &Array, axis: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_sort_axis(res, a.raw, axis, s) }
    })
}

/// Indices (uint32) that sort `a` ascending along `axis` (stable).
pub fn argsort(a: &Array, axis: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_argsort_axis(res, a.raw, axis, s) }
    })
}

/// `a` rearranged along `axis` so that position `kth` holds the element a full
/// sort would put there, smaller-or-equal ones before it and the rest after (each
/// side in unspecified order).
pub fn partition(a: &Array, kth: i32, axis: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_partition_axis(res, a.raw, kth, axis, s) }
    })
}

/// Indices (uint32) that [`partition`] `a` around `kth` along `axis`.
pub fn argpartition(a: &Array, kth: i32, axis: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_argpartition_axis(res, a.raw, kth, axis, s) }
    })
}

/// The `k` largest elements along `axis`, in unspecified order.
pub fn topk(a: &Array, k: usize, axis: i32) -> Result<Array> {
    let k = c_len(k, "top-k elements")?;
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_topk_axis(res, a.raw, k, axis, s) }
    })
}
