//! Attention masks, as mlx-lm builds them, and a per-step memo so the layers
//! of one forward pass that share a cache layout build their mask (and the
//! small arrays GPU kernels take) once.

use std::cell::RefCell;

use mlx_rs_safe::{ops, Array, Dtype};

use crate::error::Result;

/// How new tokens attend to the cached ones.
#[derive(Debug, Clone)]
pub enum AttentionMask {
    /// Every key (one new token).
    None,
    /// Keys at or before each query's position (aligned to the end).
    Causal,
    /// A boolean keep-mask broadcastable to [B, heads, queries, keys].
    Array(Array),
}

impl AttentionMask {
    /// Without padding: causal for several tokens, nothing for one.
    pub fn for_len(n: i32) -> AttentionMask {
        if n > 1 {
            AttentionMask::Causal
        } else {
            AttentionMask::None
        }
    }
}

/// `arange(start, stop)` as int32.
fn range(start: i32, stop: i32) -> Result<Array> {
    Ok(ops::arange(start as f64, stop as f64, 1.0, Dtype::Int32)?)
}

/// mlx-lm's `create_causal_mask(N, offset, window_size)`: query i (at position
/// offset + i) keeps key j when j ≤ offset + i and, with a window, j > offset + i - window.
pub fn causal_mask(n: i32, offset: i32, window: Option<i32>) -> Result<Array> {
    let keys = ops::expand_dims(&range(0, offset + n)?, &[0])?;
    let queries = ops::expand_dims(&range(offset, offset + n)?, &[1])?;
    let mut mask = ops::greater_equal(&queries, &keys)?;
    if let Some(w) = window {
        let within = ops::less(&queries, &ops::add(&keys, &Array::scalar(w))?)?;
        mask = ops::logical_and(&mask, &within)?;
    }
    Ok(mask)
}

/// `causal_mask(n, offset, window)` where row b's keys before `first_key[b]`
/// are padding: [B, 1, n, offset + n] (mlx-lm's `left_padding` argument).
/// Without padding or window this is [`AttentionMask::for_len`].
///
/// Where the padding reaches into the new tokens (prompts of several lengths
/// prefilled in one call), a padding query would keep no key at all; it keeps
/// its own, so no softmax runs over nothing (a fused kernel's -inf row gives
/// NaN, which the padding's keys and values would carry into later layers).
/// Real queries never keep a padding key either way.
pub fn padded_causal_mask(n: i32, offset: i32, window: Option<i32>, first_key: &[i32]) -> Result<AttentionMask> {
    if first_key.iter().all(|&p| p <= 0) {
        return Ok(match window {
            None => AttentionMask::for_len(n),
            Some(w) => AttentionMask::Array(causal_mask(n, offset, Some(w))?),
        });
    }
    let causal = causal_mask(n, offset, window)?;
    let keys = range(0, offset + n)?;
    let first = Array::from_slice(first_key, &[first_key.len() as i32, 1, 1, 1])?;
    let keep = ops::logical_and(&causal, &ops::greater_equal(&keys, &first)?)?;
    if first_key.iter().all(|&p| p <= offset) {
        return Ok(AttentionMask::Array(keep));
    }
    let own = ops::equal(&ops::expand_dims(&range(offset, offset + n)?, &[1])?, &ops::expand_dims(&keys, &[0])?)?;
    Ok(AttentionMask::Array(ops::logical_or(&keep, &own)?))
}

/// One token per row attending to keys whose positions are `key_pos` (any
/// order: a rotating buffer's slots), keeping those at or after `first_key[b]`:
/// [B, 1, 1, keys]; None when every key is kept.
pub fn slot_mask(key_pos: &[i32], first_key: &[i32]) -> Result<AttentionMask> {
    let oldest = key_pos.iter().copied().min().unwrap_or(0);
    if first_key.iter().all(|&p| p <= oldest) {
        return Ok(AttentionMask::None);
    }
    let keys = Array::from_slice(key_pos, &[key_pos.len() as i32])?;
    let first = Array::from_slice(first_key, &[first_key.len() as i32, 1, 1, 1])?;
    Ok(AttentionMask::Array(ops::greater_equal(&keys, &first)?))
}

/// What a mask depends on: the store kind's tag and the numbers that fix its
/// layout (write position, padding, new tokens, window).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskKey {
    pub kind: &'static str,
    pub layout: Vec<i32>,
}

/// Masks and small arrays built during one forward pass. Every layer of a
/// model holds the same rows in the same layout (a batch's rows joined and
/// advanced together), so the layers of one kind share one mask instead of
/// building it again.
#[derive(Default)]
pub struct StepMemo {
    entries: RefCell<Vec<(MaskKey, AttentionMask)>>,
    arrays: RefCell<Vec<(MaskKey, Array)>>,
}

/// The entry of `list` for `key`, made and kept the first time it is asked for.
fn memo<T: Clone>(list: &RefCell<Vec<(MaskKey, T)>>, key: MaskKey, make: impl FnOnce() -> Result<T>) -> Result<T> {
    if let Some((_, v)) = list.borrow().iter().find(|(k, _)| *k == key) {
        return Ok(v.clone());
    }
    let v = make()?;
    list.borrow_mut().push((key, v.clone()));
    Ok(v)
}

impl StepMemo {
    /// The mask for `key`, built with `make` the first time it is asked for.
    pub fn get(&self, key: MaskKey, make: impl FnOnce() -> Result<AttentionMask>) -> Result<AttentionMask> {
        memo(&self.entries, key, make)
    }

    /// The array for `key`, built with `make` the first time it is asked for.
    pub fn array(&self, key: MaskKey, make: impl FnOnce() -> Result<Array>) -> Result<Array> {
        memo(&self.arrays, key, make)
    }

    /// Forgets what the previous pass built.
    pub fn clear(&self) {
        self.entries.borrow_mut().clear();
        self.arrays.borrow_mut().clear();
    }
}
