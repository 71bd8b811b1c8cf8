//! TurboQuant KV-cache compression: keys and values rotated by a randomized
//! Hadamard transform, then quantized with Lloyd-Max codebooks (or 8-bit
//! affine keys), read by attention in the rotated basis.

mod codebook;
mod codec;
pub mod kernels;
mod rotation;
mod store;

pub use codebook::Codebook;
pub use codec::{affine_group, pack, unpack, Codec, KeyCode, TurboFormat, SINKS};
pub use rotation::Rotation;
pub use store::{prefix, servable, TurboStore};

#[cfg(test)]
mod tests;
