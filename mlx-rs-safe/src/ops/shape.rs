//! Reshaping, transposing, slicing, joining and splitting.

use std::ffi::c_int;

use mlx_sys as sys;

use crate::array::Array;
use crate::device::with_current;
use crate::error::{check, Error, Result};
use crate::ops::{c_len, int_slice};
use crate::transforms::VectorArray;
use crate::Dtype;

/// Calls an mlx-c function that writes a vector of arrays into its first argument
/// (with the current stream), and returns the arrays.
fn build_vec(
    f: impl FnOnce(&mut sys::mlx_vector_array, sys::mlx_stream) -> c_int,
) -> Result<Vec<Array>> {
    let mut out = VectorArray::empty();
    check(with_current(|s| f(&mut out.raw, s))?)?;
    out.into_arrays()
}

/// The same elements with a new shape (one entry may be -1).
pub fn reshape(a: &Array, shape: &[i32]) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_reshape(res, a.raw, p, n, s) }
    })
}

/// A copy with elements converted to `dtype`.
pub fn astype(a: &Array, dtype: Dtype) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_astype(res, a.raw, dtype.to_sys(), s) }
    })
}

/// `v` as a scalar of `dtype`: what MLX makes of a Python float beside an
/// array of that dtype (rounded through float32, as Python's does).
pub fn scalar_as(v: f32, dtype: Dtype) -> Result<Array> {
    astype(&Array::scalar(v), dtype)
}

/// The same bytes read as `dtype`; the last axis is rescaled by the size ratio.
pub fn view(a: &Array, dtype: Dtype) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_view(res, a.raw, dtype.to_sys(), s) }
    })
}

/// Reverses the axes.
pub fn transpose(a: &Array) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_transpose(res, a.raw, s) }
    })
}

/// Permutes the axes: output axis `i` is input axis `axes[i]`.
pub fn transpose_axes(a: &Array, axes: &[i32]) -> Result<Array> {
    let (p, n) = int_slice(axes);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_transpose_axes(res, a.raw, p, n, s) }
    })
}

/// Exchanges two axes.
pub fn swapaxes(a: &Array, axis1: i32, axis2: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_swapaxes(res, a.raw, axis1, axis2, s) }
    })
}

/// Moves axis `source` to position `destination`, keeping the others in order.
pub fn moveaxis(a: &Array, source: i32, destination: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_moveaxis(res, a.raw, source, destination, s) }
    })
}

/// Inserts size-1 axes at `axes` (positions in the output).
pub fn expand_dims(a: &Array, axes: &[i32]) -> Result<Array> {
    let (p, n) = int_slice(axes);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_expand_dims_axes(res, a.raw, p, n, s) }
    })
}

/// Removes the given size-1 axes.
pub fn squeeze(a: &Array, axes: &[i32]) -> Result<Array> {
    let (p, n) = int_slice(axes);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_squeeze_axes(res, a.raw, p, n, s) }
    })
}

/// Removes every size-1 axis.
pub fn squeeze_all(a: &Array) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_squeeze(res, a.raw, s) }
    })
}

/// Merges axes `start..=end` into one.
pub fn flatten(a: &Array, start_axis: i32, end_axis: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_flatten(res, a.raw, start_axis, end_axis, s) }
    })
}

/// Splits `axis` into `shape` (one entry may be -1).
pub fn unflatten(a: &Array, axis: i32, shape: &[i32]) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_unflatten(res, a.raw, axis, p, n, s) }
    })
}

/// Broadcasts `a` to `shape` (numpy rules), without copying.
pub fn broadcast_to(a: &Array, shape: &[i32]) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_broadcast_to(res, a.raw, p, n, s) }
    })
}

/// Joins `arrays` along an existing `axis`.
pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array> {
    let v = VectorArray::new(arrays);
    Array::build_s(|res, s| {
        // SAFETY: live vector of live arrays, valid out handle and stream.
        unsafe { sys::mlx_concatenate_axis(res, v.raw, axis, s) }
    })
}

/// Joins same-shaped `arrays` along a new `axis`.
pub fn stack(arrays: &[&Array], axis: i32) -> Result<Array> {
    let v = VectorArray::new(arrays);
    Array::build_s(|res, s| {
        // SAFETY: live vector of live arrays, valid out handle and stream.
        unsafe { sys::mlx_stack_axis(res, v.raw, axis, s) }
    })
}

/// Splits `a` along `axis` at the given `indices` (len(indices) + 1 parts).
pub fn split_sections(a: &Array, indices: &[i32], axis: i32) -> Result<Vec<Array>> {
    let (p, n) = int_slice(indices);
    build_vec(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_split_sections(res, a.raw, p, n, axis, s) }
    })
}

/// [`split_sections`] into exactly `N` parts, as an array to destructure
/// (`let [q, k, v] = split_sections_into(&qkv, &[i, j], -1)?`); `indices`
/// must hold `N - 1` positions.
pub fn split_sections_into<const N: usize>(a: &Array, indices: &[i32], axis: i32) -> Result<[Array; N]> {
    if indices.len() + 1 != N {
        return Err(Error::InvalidArgument(format!("{} split positions give {} parts, not {N}", indices.len(), indices.len() + 1)));
    }
    let parts = split_sections(a, indices, axis)?;
    let got = parts.len();
    parts.try_into().map_err(|_| Error::Mlx(format!("a split into {N} parts gave {got}")))
}

/// Splits `a` along `axis` into `num` equal parts.
pub fn split(a: &Array, num: usize, axis: i32) -> Result<Vec<Array>> {
    let num = c_len(num, "splits")?;
    build_vec(|res, s| {
        // SAFETY: live handles, valid out vector and stream.
        unsafe { sys::mlx_split(res, a.raw, num, axis, s) }
    })
}

/// [`split`] into `N` equal parts, as an array to destructure
/// (`let [gate, up] = split_into(&gate_up, -1)?`).
pub fn split_into<const N: usize>(a: &Array, axis: i32) -> Result<[Array; N]> {
    let parts = split(a, N, axis)?;
    let got = parts.len();
    parts.try_into().map_err(|_| Error::Mlx(format!("a split into {N} parts gave {got}")))
}

/// Checks that start/stop/strides give one entry per axis of `a`.
fn check_slice_args(a: &Array, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<()> {
    let nd = a.ndim();
    if start.len() != nd || stop.len() != nd || strides.len() != nd {
        return Err(Error::InvalidArgument(format!(
            "slice of a {nd}-d array needs {nd} starts, stops and strides, got {}, {}, {}",
            start.len(),
            stop.len(),
            strides.len()
        )));
    }
    Ok(())
}

/// `a[start:stop:strides]` with one entry per axis (negative indices count from
/// the end; out-of-range bounds are clamped as in numpy).
pub fn slice(a: &Array, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
    check_slice_args(a, start, stop, strides)?;
    let n = start.len();
    Array::build_s(|res, s| {
        // SAFETY: the three slices hold `n` ints each (checked) and live for the
        // call; live handles.
        unsafe {
            sys::mlx_slice(
                res,
                a.raw,
                start.as_ptr(),
                n,
                stop.as_ptr(),
                n,
                strides.as_ptr(),
                n,
                s,
            )
        }
    })
}

/// `a[..., start:stop, ...]` along one `axis` (negative counts from the end),
/// every other axis whole.
pub fn slice_axis(a: &Array, axis: i32, start: i32, stop: i32) -> Result<Array> {
    let shape = a.shape();
    let nd = shape.len() as i32;
    let ax = if axis < 0 { axis + nd } else { axis };
    if !(0..nd).contains(&ax) {
        return Err(Error::InvalidArgument(format!("slice_axis: axis {axis} of a {nd}-d array")));
    }
    let mut begin = vec![0; shape.len()];
    let mut end = shape;
    begin[ax as usize] = start;
    end[ax as usize] = stop;
    slice(a, &begin, &end, &vec![1; begin.len()])
}

/// A copy of `src` with `src[start:stop:strides]` replaced by `update` (broadcast).
pub fn slice_update(
    src: &Array,
    update: &Array,
    start: &[i32],
    stop: &[i32],
    strides: &[i32],
) -> Result<Array> {
    check_slice_args(src, start, stop, strides)?;
    let n = start.len();
    Array::build_s(|res, s| {
        // SAFETY: the three slices hold `n` ints each (checked) and live for the
        // call; live handles.
        unsafe {
            sys::mlx_slice_update(
                res,
                src.raw,
                update.raw,
                start.as_ptr(),
                n,
                stop.as_ptr(),
                n,
                strides.as_ptr(),
                n,
                s,
            )
        }
    })
}

/// A row-major contiguous copy (or `a` itself when it already is one; with
/// `allow_col_major`, a column-major layout is accepted too).
pub fn contiguous(a: &Array, allow_col_major: bool) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_contiguous(res, a.raw, allow_col_major, s) }
    })
}

/// Pads `axes` with `low[i]` / `high[i]` copies of the scalar `value` before / after.
pub fn pad(a: &Array, axes: &[i32], low: &[i32], high: &[i32], value: &Array) -> Result<Array> {
    if low.len() != axes.len() || high.len() != axes.len() {
        return Err(Error::InvalidArgument(format!(
            "pad needs one low and high size per axis: {} axes, {} low, {} high",
            axes.len(),
            low.len(),
            high.len()
        )));
    }
    let n = axes.len();
    Array::build_s(|res, s| {
        // SAFETY: the three slices hold `n` ints each (checked) and live for the
        // call; the mode is a NUL-terminated literal; live handles.
        unsafe {
            sys::mlx_pad(
                res,
                a.raw,
                axes.as_ptr(),
                n,
                low.as_ptr(),
                n,
                high.as_ptr(),
                n,
                value.raw,
                c"constant".as_ptr(),
                s,
            )
        }
    })
}

/// Repeats each element `repeats` times along `axis`.
pub fn repeat(a: &Array, repeats: usize, axis: i32) -> Result<Array> {
    let repeats = c_len(repeats, "repeats")?;
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_repeat_axis(res, a.raw, repeats, axis, s) }
    })
}

/// Tiles the whole array `reps[i]` times along each axis.
pub fn tile(a: &Array, reps: &[i32]) -> Result<Array> {
    let (p, n) = int_slice(reps);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_tile(res, a.raw, p, n, s) }
    })
}

/// Zeroes the elements above the `k`-th diagonal of the last two axes.
pub fn tril(a: &Array, k: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_tril(res, a.raw, k, s) }
    })
}

/// Zeroes the elements below the `k`-th diagonal of the last two axes.
pub fn triu(a: &Array, k: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles.
        unsafe { sys::mlx_triu(res, a.raw, k, s) }
    })
}
