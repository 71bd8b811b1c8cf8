//! Random sampling with explicit keys.
//!
//! MLX's generator is counter-based: a key (a `uint32` array of shape `[2]`)
//! fully determines the values drawn with it. Every function here takes the key
//! to use, so results are reproducible and no hidden global state is touched;
//! derive fresh keys with [`split`].

use mlx_sys as sys;

use crate::array::Array;
use crate::error::Result;
use crate::ops::{c_len, int_slice};
use crate::Dtype;

/// A key made from `seed`.
pub fn key(seed: u64) -> Result<Array> {
    Array::build(|res| {
        // SAFETY: valid out handle; takes no other input.
        unsafe { sys::mlx_random_key(res, seed) }
    })
}

/// `num` new keys derived from `key`, stacked into shape `[num, 2]`.
pub fn split(key: &Array, num: usize) -> Result<Array> {
    let num = c_len(num, "keys")?;
    Array::build_s(|res, s| {
        // SAFETY: live key handle, valid out handle and stream.
        unsafe { sys::mlx_random_split_num(res, key.raw, num, s) }
    })
}

/// Two new keys derived from `key` (the usual "next key, key to use now").
pub fn split2(key: &Array) -> Result<(Array, Array)> {
    // SAFETY: creates an empty handle, owned (and freed on every path) by `second`.
    let raw = unsafe { sys::mlx_array_new() };
    let mut second = Array { raw };
    let first = Array::build_s(|res, s| {
        // SAFETY: live key handle; `res` and `second.raw` are valid out handles.
        unsafe { sys::mlx_random_split(res, &mut second.raw, key.raw, s) }
    })?;
    Ok((first, second))
}

/// Normal samples with mean `loc` and standard deviation `scale`.
pub fn normal(shape: &[i32], dtype: Dtype, loc: f32, scale: f32, key: &Array) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live key handle.
        unsafe { sys::mlx_random_normal(res, p, n, dtype.to_sys(), loc, scale, key.raw, s) }
    })
}

/// Uniform samples in `[low, high)` (`low`/`high` broadcast to `shape`).
pub fn uniform(
    low: &Array,
    high: &Array,
    shape: &[i32],
    dtype: Dtype,
    key: &Array,
) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_random_uniform(res, low.raw, high.raw, p, n, dtype.to_sys(), key.raw, s) }
    })
}

/// Integer samples in `[low, high)` (`low`/`high` broadcast to `shape`).
pub fn randint(
    low: &Array,
    high: &Array,
    shape: &[i32],
    dtype: Dtype,
    key: &Array,
) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live handles.
        unsafe { sys::mlx_random_randint(res, low.raw, high.raw, p, n, dtype.to_sys(), key.raw, s) }
    })
}

/// Standard Gumbel samples.
pub fn gumbel(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    let (p, n) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `p` points to `n` ints alive for the call; live key handle.
        unsafe { sys::mlx_random_gumbel(res, p, n, dtype.to_sys(), key.raw, s) }
    })
}

/// Bool samples, true with probability `p` (broadcast to `shape`).
pub fn bernoulli(p: &Array, shape: &[i32], key: &Array) -> Result<Array> {
    let (sp, sn) = int_slice(shape);
    Array::build_s(|res, s| {
        // SAFETY: `sp` points to `sn` ints alive for the call; live handles.
        unsafe { sys::mlx_random_bernoulli(res, p.raw, sp, sn, key.raw, s) }
    })
}

/// One index (uint32) per distribution, drawn from the unnormalised log
/// probabilities `logits` along `axis` (that axis is removed).
pub fn categorical(logits: &Array, axis: i32, key: &Array) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input and key handles, valid out handle and stream.
        unsafe { sys::mlx_random_categorical(res, logits.raw, axis, key.raw, s) }
    })
}

/// `num_samples` indices per distribution (a new last axis), as [`categorical`].
pub fn categorical_n(logits: &Array, axis: i32, num_samples: usize, key: &Array) -> Result<Array> {
    let num = c_len(num_samples, "samples")?;
    Array::build_s(|res, s| {
        // SAFETY: live input and key handles, valid out handle and stream.
        unsafe { sys::mlx_random_categorical_num_samples(res, logits.raw, axis, num, key.raw, s) }
    })
}
