//! Gathering and scattering by index arrays.

use mlx_sys as sys;

use crate::array::Array;
use crate::error::{Error, Result};
use crate::ops::int_slice;
use crate::transforms::VectorArray;

/// Elements of `a` at `indices` along `axis` (the axis is replaced by the
/// indices' shape; negative indices count from the end).
pub fn take(a: &Array, indices: &Array, axis: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handles, valid out handle and stream.
        unsafe { sys::mlx_take_axis(res, a.raw, indices.raw, axis, s) }
    })
}

/// Elements of the flattened `a` at `indices` (result has the indices' shape).
pub fn take_all(a: &Array, indices: &Array) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handles, valid out handle and stream.
        unsafe { sys::mlx_take(res, a.raw, indices.raw, s) }
    })
}

/// `out[.., i, ..] = a[.., indices[.., i, ..], ..]` along `axis` (indices broadcast
/// against `a` on the other axes).
pub fn take_along_axis(a: &Array, indices: &Array, axis: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handles, valid out handle and stream.
        unsafe { sys::mlx_take_along_axis(res, a.raw, indices.raw, axis, s) }
    })
}

/// A copy of `a` with `values` written at `indices` along `axis` (the inverse of
/// [`take_along_axis`]).
pub fn put_along_axis(a: &Array, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handles, valid out handle and stream.
        unsafe { sys::mlx_put_along_axis(res, a.raw, indices.raw, values.raw, axis, s) }
    })
}

/// Checks one index array per axis.
fn check_index_axes(indices: &[&Array], axes: &[i32]) -> Result<()> {
    if indices.len() != axes.len() {
        return Err(Error::InvalidArgument(format!(
            "{} index arrays for {} axes",
            indices.len(),
            axes.len()
        )));
    }
    Ok(())
}

/// General gather: for each position of the (broadcast) `indices`, the slice of
/// `a` of shape `slice_sizes` starting at those indices on `axes` (0 elsewhere).
/// Output shape: indices' shape followed by `slice_sizes`.
pub fn gather(a: &Array, indices: &[&Array], axes: &[i32], slice_sizes: &[i32]) -> Result<Array> {
    check_index_axes(indices, axes)?;
    let v = VectorArray::new(indices);
    let (ap, an) = int_slice(axes);
    let (sp, sn) = int_slice(slice_sizes);
    Array::build_s(|res, s| {
        // SAFETY: `ap`/`sp` point to `an`/`sn` ints alive for the call; live
        // vector of live arrays; live handles.
        unsafe { sys::mlx_gather(res, a.raw, v.raw, ap, an, sp, sn, s) }
    })
}

/// General scatter: a copy of `a` with `updates` written at `indices` on `axes`.
/// `updates` has the indices' (broadcast) shape followed by one slice shape of
/// rank `a.ndim()`. With repeated indices, which write wins is unspecified.
pub fn scatter(a: &Array, indices: &[&Array], updates: &Array, axes: &[i32]) -> Result<Array> {
    check_index_axes(indices, axes)?;
    let v = VectorArray::new(indices);
    let (p, n) = int_slice(axes);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live vector of live
        // arrays; live handles.
        unsafe { sys::mlx_scatter(res, a.raw, v.raw, updates.raw, p, n, s) }
    })
}

/// Like [`scatter`], but adds `updates` into `a` (repeated indices accumulate).
pub fn scatter_add(a: &Array, indices: &[&Array], updates: &Array, axes: &[i32]) -> Result<Array> {
    check_index_axes(indices, axes)?;
    let v = VectorArray::new(indices);
    let (p, n) = int_slice(axes);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live vector of live
        // arrays; live handles.
        unsafe { sys::mlx_scatter_add(res, a.raw, v.raw, updates.raw, p, n, s) }
    })
}

/// Like [`put_along_axis`], but adds `values` (repeated indices accumulate).
pub fn scatter_add_axis(a: &Array, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handles, valid out handle and stream.
        unsafe { sys::mlx_scatter_add_axis(res, a.raw, indices.raw, values.raw, axis, s) }
    })
}
