//! TurboQuant KV-cache compression: keys and values rotated by a randomized
//! Hadamard transform, then quantized with Lloyd-Max codebooks (or 8-bit
//! affine keys), read by attention in the rotated basis.

pub mod blocked;
mod codebook;
mod codec;
pub mod kernels;
mod recent;
mod rotation;
mod store;

pub use codebook::Codebook;
pub use codec::{affine_group, pack, unpack, Codec, KeyCode, TurboFormat, SINKS};
pub use recent::{RECENT, ROOM};
#[cfg(test)]
pub use recent::TEST_RECENT;
pub use rotation::Rotation;
pub use store::{prefix, servable, TurboStore};

/// `x` as float32, the type the codec and the rotation compute in.
fn f32s(x: &mlx_rs_safe::Array) -> mlx_rs_safe::Result<mlx_rs_safe::Array> {
    mlx_rs_safe::ops::astype(x, mlx_rs_safe::Dtype::Float32)
}

#[cfg(test)]
mod tests;
