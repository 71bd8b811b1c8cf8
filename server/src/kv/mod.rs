//! Key/value caches, one per attention layer.

mod mask;
mod quantized;
mod rotating;
mod standard;

pub use mask::{causal_mask, AttentionMask};
pub use quantized::QuantizedKvCache;
pub use rotating::RotatingKvCache;
pub use standard::StandardKvCache;

use mlx_rs_safe::Array;

use crate::error::Result;

/// Cached keys and values as attention reads them.
pub enum KvView {
    Dense { keys: Array, values: Array },
    /// Affine-quantized (packed, scales, biases) for keys and values.
    Quantized { keys: [Array; 3], values: [Array; 3], group_size: i32, bits: i32 },
}

/// What attention needs from a cache.
pub trait KvCache: Send {
    /// Tokens already cached (the position of the next token).
    fn offset(&self) -> i32;
    /// Appends `keys`/`values` ([B, kv_heads, L, head_dim]) and returns all cached
    /// keys and values up to the new offset.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvView>;
    /// The mask for `n` new tokens attending to this cache (mlx-lm's
    /// `make_mask`); `window` limits how far back a token may look.
    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        if let Some(w) = window {
            return Ok(AttentionMask::Array(causal_mask(n, self.offset(), Some(w))?));
        }
        Ok(if n == 1 { AttentionMask::None } else { AttentionMask::Causal })
    }
    /// This cache converted to an affine-quantized one, or None where that does
    /// not apply (already quantized).
    fn to_quantized(&self, group_size: i32, bits: i32) -> Result<Option<Box<dyn KvCache>>>;
    /// The arrays holding the cache, to evaluate after a prefill chunk.
    fn state(&self) -> Vec<Array>;
    /// Bytes held.
    fn nbytes(&self) -> usize;
}
