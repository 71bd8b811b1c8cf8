//! Attention masks, as mlx-lm builds them.

use mlx_rs_safe::{ops, Array, Dtype};

use crate::error::Result;

/// How new tokens attend to the cached ones.
#[derive(Debug, Clone)]
pub enum AttentionMask {
    /// Every key (one new token).
    None,
    /// Keys at or before each query's position (aligned to the end).
    Causal,
    /// A boolean keep-mask [queries, keys].
    Array(Array),
}

impl AttentionMask {
    /// Without a cache: causal for several tokens, nothing for one.
    pub fn for_len(n: i32) -> AttentionMask {
        if n > 1 { AttentionMask::Causal } else { AttentionMask::None }
    }
}

/// mlx-lm's `create_causal_mask(N, offset, window_size)`: query i (at position
/// offset + i) keeps key j when j ≤ offset + i and, with a window, j > offset + i - window.
pub fn causal_mask(n: i32, offset: i32, window: Option<i32>) -> Result<Array> {
    let rinds = ops::arange(0.0, (offset + n) as f64, 1.0, Dtype::Int32)?;
    let linds = if offset != 0 { ops::arange(offset as f64, (offset + n) as f64, 1.0, Dtype::Int32)? } else { rinds.clone() };
    let linds = ops::expand_dims(&linds, &[1])?;
    let rinds = ops::expand_dims(&rinds, &[0])?;
    let mut mask = ops::greater_equal(&linds, &rinds)?;
    if let Some(w) = window {
        let within = ops::less(&linds, &ops::add(&rinds, &Array::scalar(w))?)?;
        mask = ops::logical_and(&mask, &within)?;
    }
    Ok(mask)
}
