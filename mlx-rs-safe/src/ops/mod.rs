//! Array operations, as free functions over `&Array` running on the thread's
//! current stream. Grouped by kind; everything is re-exported here.

use mlx_sys as sys;

use crate::error::{Error, Result};

/// Defines `pub fn name(a: &Array) -> Result<Array>` over an mlx-c unary op.
macro_rules! unary_ops {
    ($($(#[$m:meta])* $name:ident => $ffi:ident),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(a: &Array) -> Result<Array> {
            Array::build_s(|res, s| {
                // SAFETY: live input handle, valid out handle and stream.
                unsafe { mlx_sys::$ffi(res, a.raw, s) }
            })
        }
    )*};
}

/// Defines `pub fn name(a: &Array, b: &Array) -> Result<Array>` over an mlx-c
/// binary op (numpy broadcasting and type promotion).
macro_rules! binary_ops {
    ($($(#[$m:meta])* $name:ident => $ffi:ident),* $(,)?) => {$(
        $(#[$m])*
        pub fn $name(a: &Array, b: &Array) -> Result<Array> {
            Array::build_s(|res, s| {
                // SAFETY: live input handles, valid out handle and stream.
                unsafe { mlx_sys::$ffi(res, a.raw, b.raw, s) }
            })
        }
    )*};
}

pub(crate) use {binary_ops, unary_ops};

/// Converts a list of axes/shape entries to the `(ptr, len)` mlx-c expects.
pub(crate) fn int_slice(v: &[i32]) -> (*const i32, usize) {
    (v.as_ptr(), v.len())
}

/// Checks an axis count fits in a C int.
pub(crate) fn c_len(n: usize, what: &str) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::InvalidArgument(format!("too many {what}")))
}

mod creation;
mod indexing;
mod math;
mod reduce;
mod shape;
mod sort;

pub use creation::*;
pub use indexing::*;
pub use math::*;
pub use reduce::*;
pub use shape::*;
pub use sort::*;

#[allow(unused_imports)]
use sys as _;
