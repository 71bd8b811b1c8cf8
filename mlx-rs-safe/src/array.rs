//! `Array`: an owned handle to an MLX array (lazy until evaluated).

use std::ffi::c_int;
use std::fmt;

use mlx_sys as sys;

use crate::device::with_current;
use crate::dtype::{Dtype, Element};
use crate::error::{check, init, take_last_error, Error, Result};

/// An MLX array. Dropping it releases this handle; `clone` shares the same array
/// (MLX reference counting), it does not copy data.
pub struct Array {
    pub(crate) raw: sys::mlx_array,
}

// SAFETY: an mlx_array handle is a reference-counted pointer to an immutable array
// node; moving the handle to another thread is sound. It is not `Sync`: MLX graphs
// are built and evaluated from one thread at a time (the engine thread).
unsafe impl Send for Array {}

impl Array {
    /// Calls an mlx-c function that writes a new array into its first argument, and
    /// wraps the result; a non-zero status becomes `Err` with MLX's message.
    pub(crate) fn build(f: impl FnOnce(&mut sys::mlx_array) -> c_int) -> Result<Array> {
        init();
        // SAFETY: an empty handle, owned by `out` (freed on every path by Drop).
        let mut out = Array { raw: unsafe { sys::mlx_array_new() } };
        check(f(&mut out.raw))?;
        Ok(out)
    }

    /// Like [`Array::build`], with the thread's current stream passed along.
    pub(crate) fn build_s(
        f: impl FnOnce(&mut sys::mlx_array, sys::mlx_stream) -> c_int,
    ) -> Result<Array> {
        with_current(|s| Array::build(|res| f(res, s)))?
    }

    /// An array holding a copy of `data` with the given shape.
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        let expected = shape_len(shape)?;
        if expected != data.len() {
            return Err(Error::InvalidArgument(format!(
                "shape {shape:?} holds {expected} elements, data has {}",
                data.len()
            )));
        }
        // SAFETY: Element is sealed to plain number types laid out as T::DTYPE's
        // values: every byte of `data` is initialized and readable.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        Array::from_bytes(bytes, shape, T::DTYPE)
    }

    /// An array holding a copy of `bytes`, read as `dtype` values of the given
    /// shape (e.g. a tensor's bytes as they lie in a weights file).
    pub fn from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        let expected = shape_len(shape)?
            .checked_mul(dtype.size_of())
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows")))?;
        if expected != bytes.len() {
            return Err(Error::InvalidArgument(format!(
                "shape {shape:?} of {dtype:?} holds {expected} bytes, data has {}",
                bytes.len()
            )));
        }
        init();
        let ndim = c_int::try_from(shape.len())
            .map_err(|_| Error::InvalidArgument("too many dimensions".into()))?;
        // SAFETY: `bytes` holds exactly prod(shape) * size_of(dtype) bytes; mlx-c
        // copies them (any bit pattern is a valid value of every MLX dtype but
        // bool, which MLX reads as zero / non-zero).
        let raw = unsafe { sys::mlx_array_new_data(bytes.as_ptr().cast(), shape.as_ptr(), ndim, dtype.to_sys()) };
        Ok(Array { raw })
    }

    /// A 0-d array.
    pub fn scalar<T: Element>(value: T) -> Array {
        // A 0-d shape always matches one element.
        Array::from_slice(&[value], &[]).expect("one element fits shape []")
    }

    /// A 1-d array holding a copy of `data`.
    pub fn from_vec<T: Element>(data: &[T]) -> Result<Array> {
        let n = i32::try_from(data.len())
            .map_err(|_| Error::InvalidArgument("too many elements for one axis".into()))?;
        Array::from_slice(data, &[n])
    }

    pub fn shape(&self) -> Vec<i32> {
        let n = self.ndim();
        if n == 0 {
            return Vec::new();
        }
        // SAFETY: mlx_array_shape returns `ndim` ints owned by the live array.
        unsafe { std::slice::from_raw_parts(sys::mlx_array_shape(self.raw), n) }.to_vec()
    }

    pub fn ndim(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlx_array_ndim(self.raw) }
    }

    /// Number of elements.
    pub fn size(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlx_array_size(self.raw) }
    }

    pub fn nbytes(&self) -> usize {
        // SAFETY: live handle.
        unsafe { sys::mlx_array_nbytes(self.raw) }
    }

    pub fn dtype(&self) -> Dtype {
        // SAFETY: live handle.
        Dtype::from_sys(unsafe { sys::mlx_array_dtype(self.raw) })
    }

    /// Size of `axis` (negative counts from the end).
    pub fn dim(&self, axis: i32) -> Result<i32> {
        let shape = self.shape();
        let n = shape.len() as i32;
        let a = if axis < 0 { axis + n } else { axis };
        if a < 0 || a >= n {
            return Err(Error::InvalidArgument(format!(
                "axis {axis} out of range for {n}-d array"
            )));
        }
        Ok(shape[a as usize])
    }

    /// Computes the array (and what it depends on) now.
    pub fn eval(&self) -> Result<()> {
        crate::transforms::eval(&[self])
    }

    /// Element strides (in elements, not bytes) of the evaluated array.
    fn strides(&self) -> Vec<usize> {
        let n = self.shape().len();
        if n == 0 {
            return Vec::new();
        }
        // SAFETY: live handle; mlx-c returns a pointer to `ndim` strides owned
        // by the array, copied before the array can change.
        let ptr = unsafe { sys::mlx_array_strides(self.raw) };
        if ptr.is_null() {
            return Vec::new();
        }
        // SAFETY: as above, `n` = ndim entries.
        unsafe { std::slice::from_raw_parts(ptr, n) }.to_vec()
    }

    /// Whether the evaluated array's elements lie in row-major order with no
    /// gaps (dimensions of size 1 may have any stride).
    fn is_row_contiguous(&self) -> bool {
        let shape = self.shape();
        let strides = self.strides();
        if strides.len() != shape.len() {
            return false;
        }
        let mut expected = 1usize;
        for (&d, &st) in shape.iter().zip(&strides).rev() {
            if d != 1 && st != expected {
                return false;
            }
            expected *= d.max(1) as usize;
        }
        true
    }

    /// An evaluated array's buffer (its first element): callers evaluate
    /// first (`to_vec` already has, on its read-back path).
    pub(crate) fn data_ptr(&self) -> Result<*const u8> {
        // SAFETY: live handle, evaluated by the caller; mlx-c returns its data
        // pointer (or null after reporting an error).
        let ptr = unsafe { sys::mlx_array_data_uint8(self.raw) };
        if ptr.is_null() {
            return Err(Error::Mlx(take_last_error().unwrap_or_else(|| "no data".into())));
        }
        Ok(ptr)
    }

    /// Copies the elements out, in row-major order, evaluating first.
    ///
    /// Only this array is evaluated (as Python's `item()` / `tolist()` do): an
    /// already contiguous result is read in place, so no new op is queued
    /// behind work the caller queued meanwhile with `async_eval` — which would
    /// make the host wait for that work too. Strided results get one copy.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            return Err(Error::DtypeMismatch {
                actual: self.dtype(),
                requested: T::DTYPE,
            });
        }
        init();
        // SAFETY: live handle.
        check(unsafe { sys::mlx_array_eval(self.raw) })?;
        let c = if self.is_row_contiguous() {
            self.clone()
        } else {
            let c = Array::build_s(|res, s| {
                // SAFETY: live input handle, valid out handle and stream.
                unsafe { sys::mlx_contiguous(res, self.raw, false, s) }
            })?;
            c.eval()?;
            c
        };
        let n = c.size();
        if n == 0 {
            return Ok(Vec::new());
        }
        let ptr = c.data_ptr()?;
        // SAFETY: `c` is evaluated, row-contiguous (checked, or made so), of
        // dtype T::DTYPE (checked above) and holds `n` elements from its data
        // pointer on; MLX aligns buffers for any element type; we copy before
        // `c` is dropped.
        Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), n) }.to_vec())
    }

    /// The single element of a one-element array.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.size() != 1 {
            return Err(Error::InvalidArgument(format!(
                "item() needs one element, array has shape {:?}",
                self.shape()
            )));
        }
        Ok(self.to_vec::<T>()?[0])
    }
}

/// Number of elements of `shape`, rejecting negative dimensions and overflow.
pub(crate) fn shape_len(shape: &[i32]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d)
            .map_err(|_| Error::InvalidArgument(format!("negative dimension in {shape:?}")))?;
        acc.checked_mul(d)
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows")))
    })
}

impl Clone for Array {
    fn clone(&self) -> Self {
        // SAFETY: a fresh handle set to share `self`'s array; setting cannot fail
        // for two live handles.
        let mut out = Array { raw: unsafe { sys::mlx_array_new() } };
        unsafe { sys::mlx_array_set(&mut out.raw, self.raw) };
        out
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        // SAFETY: each Array owns its handle and frees it exactly once.
        unsafe { sys::mlx_array_free(self.raw) };
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array(shape={:?}, dtype={:?})", self.shape(), self.dtype())
    }
}

impl fmt::Display for Array {
    /// MLX's own printout (evaluates the array).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = crate::mlx_string::MlxString::new();
        // SAFETY: live array and string handles; the string is set in place.
        let status = unsafe { sys::mlx_array_tostring(&mut s.raw, self.raw) };
        let text = if check(status).is_ok() { s.text() } else { format!("{self:?}") };
        f.write_str(&text)
    }
}
