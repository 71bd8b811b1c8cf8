//! Key/value caches. Every cache holds a batch of sequences ("rows"); one
//! sequence is a batch of one. A model's [`ModelCache`] has a [`LayerCache`]
//! per layer, which keeps its rows in one [`KvStore`] per cache kind (dense,
//! affine-quantized, rotating window) and runs attention over them, or, in a
//! linear-attention layer, the recurrent state its model updates. The
//! prompt cache keeps finished sequences' rows as [`KvSnapshot`]s.

mod affine;
mod cache;
mod compression;
mod dense;
mod layer;
mod mask;
mod padded;
mod prompt_cache;
mod recurrent;
mod rotating;
mod sdpa;
mod snapshot;
mod store;
pub mod turbo;

pub use cache::ModelCache;
pub use compression::{bytes_per_token, CompressAt, KvCompression, Phase, TurboPreset, AFFINE_BITS, AFFINE_GROUP_SIZES};
pub use layer::LayerCache;
pub use mask::{causal_mask, AttentionMask, StepMemo};
/// Tokens a cache grows by at a time.
pub const KV_STEP: usize = padded::STEP as usize;
pub use prompt_cache::{PromptCache, PromptCacheHit};
pub use sdpa::{quantized_matmuls_run, unfused_prefill_keys};
pub use recurrent::RecurrentStore;
pub use snapshot::KvSnapshot;
pub use store::{AttendArgs, KvKind, KvRow, KvStore, UndoPoint};

use mlx_rs_safe::Array;

/// The positions of the new tokens, as rope needs them.
pub enum Positions {
    /// Every row starts at this position.
    Scalar(i32),
    /// One start position per batch row ([B] int32): rows of a batch hold
    /// sequences of different lengths.
    PerRow(Array),
}

#[cfg(test)]
mod tests;

/// An array's values as f32, for the tests of the caches.
#[cfg(test)]
fn values(a: &Array) -> Vec<f32> {
    mlx_rs_safe::ops::astype(a, mlx_rs_safe::Dtype::Float32).unwrap().to_vec::<f32>().unwrap()
}
