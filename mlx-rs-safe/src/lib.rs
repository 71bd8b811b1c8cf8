//! Safe Rust over MLX's C API (mlx-c), plus mlx-serve's own primitives.
//!
//! All `unsafe` of the workspace lives in this crate, each block next to the one
//! FFI call it makes, with the invariant it relies on in a `SAFETY` comment. Every
//! fallible call returns [`Result`]: an invalid op yields `Err` with MLX's message
//! and the process carries on.

mod array;
mod device;
mod dtype;
mod error;
mod kernel_direct;
mod mlx_string;
mod optional;
mod transforms;

pub mod compile;
pub mod distributed;
pub mod ext;
pub mod fast;
pub mod graph;
pub mod io;
pub mod kernels;
pub mod managed_memory;
pub mod memory;
pub mod ops;
pub mod process_heap;
pub mod quantized;
pub mod random;

pub use array::Array;
pub use device::{current_device, set_default_device, synchronize, with_stream, Device, Stream};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result};
pub use transforms::{async_eval, eval};

/// The MLX version mlx-c reports (e.g. "0.32.4").
pub fn mlx_version() -> String {
    let mut s = mlx_string::MlxString::new();
    // SAFETY: live handle, set in place.
    let status = unsafe { mlx_sys::mlx_version(&mut s.raw) };
    if error::check(status).is_ok() {
        s.text()
    } else {
        String::new()
    }
}
