//! Key/value caches, one per attention layer.

mod standard;

pub use standard::StandardKvCache;

use mlx_rs_safe::Array;

use crate::error::Result;

/// What attention needs from a cache.
pub trait KvCache: Send {
    /// Tokens already cached (the position of the next token).
    fn offset(&self) -> i32;
    /// Appends `keys`/`values` ([B, kv_heads, L, head_dim]) and returns all cached
    /// keys and values up to the new offset.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)>;
    /// The arrays holding the cache, to evaluate after a prefill chunk.
    fn state(&self) -> Vec<Array>;
    /// Bytes held.
    fn nbytes(&self) -> usize;
}
