//! mlx-serve's own MLX primitives (compiled into libmlxc from `patches/`).

use std::os::fd::AsRawFd;

use crate::array::{shape_len, Array};
use crate::dtype::Dtype;
use crate::error::Result;

/// A lazy array of `shape`/`dtype` whose bytes are read from `file` at `offset`
/// with pread(2) when the array is evaluated (on the CPU stream; the buffer is
/// readable by every backend).
///
/// The array keeps its own duplicate of the descriptor, so `file` may be closed
/// right away. An invalid descriptor fails here; a file shorter than
/// `offset + nbytes` fails the evaluation with an `Err` naming offset and length.
pub fn pread_into(file: &impl AsRawFd, offset: u64, shape: &[i32], dtype: Dtype) -> Result<Array> {
    pread_into_fd(file.as_raw_fd(), offset, shape, dtype)
}

/// [`pread_into`] on a raw descriptor number (which may be invalid: that is an `Err`).
pub fn pread_into_fd(fd: i32, offset: u64, shape: &[i32], dtype: Dtype) -> Result<Array> {
    shape_len(shape)?;
    Array::build(|res| {
        // SAFETY: `shape` is valid for `shape.len()` ints during the call; the
        // primitive validates the descriptor itself (fcntl) and dups it.
        unsafe {
            mlx_sys::mlxs_pread_into(res, fd, offset, shape.as_ptr(), shape.len(), dtype.to_sys())
        }
    })
}

/// A lazy array of `shape`/`dtype` read from a slice of a row-major tensor in
/// `file`: its bytes are consecutive blocks of `block_bytes`, block i read at
/// `offset + i * block_stride` (a column range of every row: the block is the
/// range's bytes, the stride a row's). Only the slice's bytes are read.
pub fn pread_blocks_into(
    file: &impl AsRawFd,
    offset: u64,
    block_bytes: u64,
    block_stride: u64,
    shape: &[i32],
    dtype: Dtype,
) -> Result<Array> {
    shape_len(shape)?;
    let fd = file.as_raw_fd();
    Array::build(|res| {
        // SAFETY: `shape` is valid for `shape.len()` ints during the call; the
        // primitive validates the descriptor and the block layout itself.
        unsafe {
            mlx_sys::mlxs_pread_blocks_into(res, fd, offset, block_bytes, block_stride, shape.as_ptr(), shape.len(), dtype.to_sys())
        }
    })
}
