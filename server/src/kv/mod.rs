//! Key/value caches, one per attention layer.

mod batch;
mod mask;
mod prompt_cache;
mod quantized;
mod rotating;
mod snapshot;
mod standard;

pub use batch::{BatchKvCache, KvRows};
pub use mask::{causal_mask, AttentionMask};
pub use prompt_cache::{PromptCache, PromptCacheHit};
pub use quantized::QuantizedKvCache;
pub use rotating::RotatingKvCache;
pub use snapshot::KvSnapshot;
pub use standard::StandardKvCache;

use std::any::Any;

use mlx_rs_safe::Array;

use crate::error::Result;

/// Cached keys and values as attention reads them.
pub enum KvView {
    Dense { keys: Array, values: Array },
    /// Affine-quantized (packed, scales, biases) for keys and values.
    Quantized { keys: [Array; 3], values: [Array; 3], group_size: i32, bits: i32 },
}

/// The positions of the new tokens, as rope needs them.
pub enum Positions {
    /// Every row starts at this position.
    Scalar(i32),
    /// One start position per batch row ([B] int32): rows of a batch hold
    /// sequences of different lengths (left-padded).
    PerRow(Array),
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
    /// Where the next tokens sit, for rotary embeddings.
    fn positions(&self) -> Result<Positions> {
        Ok(Positions::Scalar(self.offset()))
    }
    /// The cached keys and values ([B, kv_heads, offset, head_dim]) when they
    /// are stored plainly in position order, so they can be copied into a batch
    /// or the prompt cache; None for rotating and quantized caches.
    fn dense_rows(&self) -> Result<Option<(Array, Array)>> {
        Ok(None)
    }
    /// For an affine-quantized cache: the cached (packed, scales, biases) of
    /// keys and of values up to the offset, its group size and bits.
    fn quantized_rows(&self) -> Option<([Array; 3], [Array; 3], i32, i32)> {
        None
    }
    /// For the batch scheduler, which owns concrete [`BatchKvCache`]s behind
    /// the trait objects the models take.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// This cache converted to an affine-quantized one, or None where that does
    /// not apply (already quantized).
    fn to_quantized(&self, group_size: i32, bits: i32) -> Result<Option<Box<dyn KvCache>>>;
    /// The arrays holding the cache, to evaluate after a prefill chunk.
    fn state(&self) -> Vec<Array>;
    /// Bytes held.
    fn nbytes(&self) -> usize;
}
